-- 09_seed_examples: the "Examples" section of the user's README, statements
-- as written there, each with its documented result.
\set VERBOSITY default
\set SHOW_CONTEXT never
-- The examples are separate scenarios on the same key job-42: example 2
-- starts from a job-42 that was never leased (its takeover gives epoch 2).
-- Each example starts from a fresh install, the documented way to reset.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;

-- 1. Safe retry loop: duplicate acquire returns the same epoch, so a
--    client that loses its result can re-ask without side effects.
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '30s');  -- same epoch

DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;

-- 2. Takeover of a dead holder's lease by a new owner (a1 stopped
--    renewing; its 10s TTL lapses; b2 blocks until it can take over).
-- Changed from the README to keep the suite fast: a1's ttl is '1s' instead
-- of '10s' (b2's wait of '15s' and ttl of '30s' are as written).
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '1s');
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-b2', interval '30s', interval '15s');
-- returns acquired=t with a NEW epoch (2) once the old lease lapses

-- 3. The old owner is now fenced: its renew fails...
SELECT status FROM lease.renew('job-42', 'worker-a1', 1, interval '30s');   -- lapsed
-- ...and any guard that recorded epoch 1 rejects epoch-1 actions.
SELECT lease.fence('job-42', 'worker-a1', 1);

-- 4. Inspect as a fencing watermark.
SELECT held, owner, epoch FROM lease.inspect('job-42');
-- held=f rows expose the counter: epochs <= it are stale.
-- (Added: after b2 releases, the held=f row shows counter 3; the next grant
-- gets 4.)
SELECT status FROM lease.release('job-42', 'worker-b2', 2);
SELECT held, owner, epoch FROM lease.inspect('job-42');

-- 5. Distinct keys never interact.
SELECT acquired FROM lease.acquire('job-43', 'worker-a1', interval '30s');  -- independent
SELECT held, owner, epoch FROM lease.inspect('job-42');
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '30s');

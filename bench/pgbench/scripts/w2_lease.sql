-- W2-contend: one acquire attempt on one of 4 shared keys. The 2 ms TTL makes
-- a share of the attempts takeovers (writes, row-lock contention) and the rest
-- denials or idempotent re-acquires (reads); the run reports the share.
\set k random(1, 4)
SELECT acquired FROM lease.acquire('w2-' || :k::text, 'c' || :client_id::text, interval '2 ms');

-- 80_batch_bounds (0.5.0): acquire_many and release_many pair keys and
-- epochs by position whatever the arrays' lower bounds; every one-statement
-- path (renew, release, wait-0 acquire, the idempotent re-acquire, both
-- batches) raises synchronous_commit off to on in its transaction, and the
-- changes write their history events.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- lower bounds other than 1: rows in input order, epochs paired by position
SELECT key, acquired, epoch FROM lease.acquire_many('[5:7]={bb-x,bb-y,bb-z}'::text[], 'o', interval '30s');
SELECT key, status FROM lease.release_many('{bb-z,bb-x,bb-y}'::text[], 'o', '[3:5]={1,1,2}'::bigint[]);
SELECT key, status FROM lease.release_many('[2:2]={bb-y}'::text[], 'o', '[7:7]={1}'::bigint[]);
SELECT key, owner, epoch FROM lease.leases WHERE key LIKE 'bb-%' ORDER BY key;

-- durability: each path under synchronous_commit = off
SET synchronous_commit = off;
BEGIN;
SELECT acquired, epoch FROM lease.acquire('bb-d', 'o', interval '30s');  -- first grant
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT acquired, epoch FROM lease.acquire('bb-d', 'o', interval '30s');  -- idempotent
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT status FROM lease.renew('bb-d', 'o', 1, interval '30s');
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT status FROM lease.release('bb-d', 'o', 1);
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT acquired, epoch FROM lease.acquire('bb-d', 'o', interval '30s');  -- a free row
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT key, status FROM lease.release_many('{bb-d}', 'o', '{3}');
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
BEGIN;
SELECT key, acquired, epoch FROM lease.acquire_many('{bb-d}', 'o', interval '30s');
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
-- a refusal changes nothing and raises nothing
BEGIN;
SELECT status FROM lease.renew('bb-d', 'o', 1, interval '30s');
SELECT current_setting('synchronous_commit') AS sc;
COMMIT;
RESET synchronous_commit;
SELECT event, owner, epoch FROM lease.history WHERE key = 'bb-d' ORDER BY seq;

-- 07_durability: a call that changes a lease makes its transaction's commit
-- durable: with synchronous_commit = off it raises the setting to 'local' for
-- that transaction only. Calls that change nothing leave it alone, and a
-- setting that already flushes (on, remote_apply, ...) is never changed.
-- (Crash behaviour itself is tested by the Go failure suite.)
\set VERBOSITY default
\set SHOW_CONTEXT never

-- successful acquire (first grant, takeover of a free key), renew, release
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT acquired, epoch FROM lease.acquire('dur-1', 'o1', interval '30s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT status FROM lease.renew('dur-1', 'o1', 1, interval '30s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT status FROM lease.release('dur-1', 'o1', 1);
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT acquired, epoch FROM lease.acquire('dur-1', 'o1', interval '30s');
SELECT current_setting('synchronous_commit');
COMMIT;

-- calls that change nothing: denied acquire, idempotent re-acquire, inspect,
-- list, fence, failed renew and release
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT acquired FROM lease.acquire('dur-1', 'o2', interval '30s');
SELECT current_setting('synchronous_commit');
SELECT acquired, epoch FROM lease.acquire('dur-1', 'o1', interval '30s');
SELECT current_setting('synchronous_commit');
SELECT held, owner, epoch FROM lease.inspect('dur-1');
SELECT current_setting('synchronous_commit');
SELECT count(*) > 0 AS listed FROM lease.list();
SELECT current_setting('synchronous_commit');
SELECT lease.fence('dur-1', 'o1', 3) > clock_timestamp() AS fenced;
SELECT current_setting('synchronous_commit');
SELECT status FROM lease.renew('dur-1', 'o2', 3, interval '30s');
SELECT current_setting('synchronous_commit');
SELECT status FROM lease.renew('dur-1', 'o1', 1, interval '30s');
SELECT current_setting('synchronous_commit');
SELECT status FROM lease.release('dur-1', 'o2', 3);
SELECT current_setting('synchronous_commit');
COMMIT;

-- force_release changes the lease: forced as well
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT released, previous_owner, epoch FROM lease.force_release('dur-1');
SELECT current_setting('synchronous_commit');
COMMIT;

-- the forcing lasts for the changing transaction only: a session-level off
-- is back after it
SET synchronous_commit = off;
SELECT (lease.acquire('dur-2', 'o1', interval '30s')).acquired,
       current_setting('synchronous_commit') AS within_the_statement;
SHOW synchronous_commit;
RESET synchronous_commit;

-- a setting that already flushes locally is left as it is
BEGIN;
SET LOCAL synchronous_commit = remote_apply;
SELECT status FROM lease.renew('dur-2', 'o1', 1, interval '30s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = on;
SELECT status FROM lease.release('dur-2', 'o1', 1);
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = remote_write;
SELECT acquired, epoch FROM lease.acquire('dur-2', 'o1', interval '30s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = local;
SELECT status FROM lease.release('dur-2', 'o1', 3);
SELECT current_setting('synchronous_commit');
COMMIT;

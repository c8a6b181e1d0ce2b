-- 10_fence_force_release: lease.fence (the same-database guard) and
-- lease.force_release (operators only).
\set VERBOSITY default
\set SHOW_CONTEXT never

-- fence: ok returns the grant's expiry
SELECT acquired, epoch FROM lease.acquire('fence-1', 'o1', interval '30s');
SELECT lease.fence('fence-1', 'o1', 1) = (SELECT expires_at FROM lease.inspect('fence-1'))
       AS returns_expiry;
-- every failure raises SQLSTATE 55000 with the status as message, and the
-- same precedence as renew: not_owner, lapsed, epoch_mismatch
SELECT lease.fence('fence-none', 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('fence-1', 'o2', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('fence-1', 'o2', 9);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('fence-1', 'o1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT acquired, epoch FROM lease.acquire('fence-2', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT lease.fence('fence-2', 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('fence-2', 'o1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT acquired, epoch FROM lease.acquire('fence-2', 'o2', interval '30s');
SELECT lease.fence('fence-2', 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM lease.release('fence-2', 'o2', 2);
SELECT lease.fence('fence-2', 'o2', 2);
\echo :LAST_ERROR_SQLSTATE

-- a fenced transaction can still renew and release its own grant (its share
-- lock is upgraded, not waited for), and its writes commit with the check
CREATE TABLE fenced_writes (key text, epoch bigint);
BEGIN;
SELECT lease.fence('fence-1', 'o1', 1) > clock_timestamp() AS fenced;
INSERT INTO fenced_writes VALUES ('fence-1', 1);
SELECT status FROM lease.renew('fence-1', 'o1', 1, interval '30s');
COMMIT;
-- a failed fence aborts the caller's transaction and so its writes
BEGIN;
INSERT INTO fenced_writes VALUES ('fence-1', 7);
SELECT lease.fence('fence-1', 'o1', 7);
COMMIT;
SELECT * FROM fenced_writes;
DROP TABLE fenced_writes;

-- force_release: EXECUTE is revoked from PUBLIC
CREATE ROLE regress_pglease_operator;
SET ROLE regress_pglease_operator;
SELECT * FROM lease.force_release('fence-1');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT held, owner, epoch FROM lease.inspect('fence-1');
GRANT EXECUTE ON FUNCTION lease.force_release(text) TO regress_pglease_operator;
SET ROLE regress_pglease_operator;
-- a held grant: ended, epoch incremented, the former holder fenced
SELECT released, previous_owner, epoch FROM lease.force_release('fence-1');
SELECT held, owner, epoch FROM lease.inspect('fence-1');
SELECT status FROM lease.renew('fence-1', 'o1', 1, interval '30s');
SELECT lease.fence('fence-1', 'o1', 1);
-- a free key: nothing to end, epoch is the counter
SELECT released, previous_owner, epoch FROM lease.force_release('fence-1');
-- a never-leased key: nothing, no row created
SELECT released, previous_owner, epoch FROM lease.force_release('fence-none');
SELECT count(*) AS rows_for_fence_none FROM lease.inspect('fence-none');
-- a lapsed grant: ended too
SELECT acquired, epoch FROM lease.acquire('fence-3', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT released, previous_owner, epoch FROM lease.force_release('fence-3');
SELECT status FROM lease.renew('fence-3', 'o1', 1, interval '30s');
-- the next grant after a force_release has the next epoch
SELECT acquired, epoch FROM lease.acquire('fence-1', 'o2', interval '30s');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION lease.force_release(text) FROM regress_pglease_operator;
DROP ROLE regress_pglease_operator;

-- 07_durability: a call that changes a lease makes its transaction's commit
-- durable: with synchronous_commit = off or local it raises the setting to
-- 'on' (0.3.0; 'local' in 0.1.0/0.2.0) for that transaction only, so the
-- commit also waits for the configured synchronous standbys. Calls that
-- change nothing leave it alone, and on, remote_write and remote_apply are
-- never changed.
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

-- calls that change nothing: denied acquire, inspect, list, fence, failed
-- renew and release
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT acquired FROM lease.acquire('dur-1', 'o2', interval '30s');
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

-- 0.4.0: the idempotent re-acquire changes nothing, but its answer confirms
-- a grant, so it is forced like a change (with its row lock, its commit waits
-- for the synchronous standbys: SEMANTICS section 17.1)
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT acquired, epoch FROM lease.acquire('dur-1', 'o1', interval '30s');
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

-- a setting that already waits for synchronous standbys (on, remote_write,
-- remote_apply) is left as it is; local (flushes locally, waits for no
-- standby) is raised to on (0.3.0)
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

-- 0.3.0: local is raised to on too (local never waits for a synchronous
-- standby); a later SET LOCAL in the same transaction wins: the caller that
-- lowers the setting after a change owns that choice (documented, SEMANTICS
-- section 11), pg_lease cannot see it.
BEGIN;
SET LOCAL synchronous_commit = local;
SELECT acquired FROM lease.acquire('dur-local', 'o1', interval '30s');
SELECT current_setting('synchronous_commit') AS after_acquire;
SET LOCAL synchronous_commit = off;
SELECT current_setting('synchronous_commit') AS after_a_later_set_local;
COMMIT;
SELECT status FROM lease.release('dur-local', 'o1', 1);

-- lease.configure changes the settings (max_ttl, the carried-over grace): its
-- commit is forced durable too (rolled back here: the settings stay as they are)
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT configured_max_ttl FROM lease.configure(max_ttl => interval '1 hour');
SELECT current_setting('synchronous_commit') AS after_configure;
ROLLBACK;

-- local is raised to on by renew and configure too
BEGIN;
SET LOCAL synchronous_commit = local;
SELECT acquired FROM lease.acquire('dur-local2', 'o1', interval '30s');
SET LOCAL synchronous_commit = local;
SELECT status FROM lease.renew('dur-local2', 'o1', 1, interval '30s');
SELECT current_setting('synchronous_commit') AS after_renew;
SET LOCAL synchronous_commit = local;
SELECT configured_max_ttl FROM lease.configure(max_ttl => interval '1 hour');
SELECT current_setting('synchronous_commit') AS after_configure;
ROLLBACK;

-- The forcing is the transaction's only: a session that runs with
-- synchronous_commit = off has it back after configure's transaction.
SET synchronous_commit = off;
BEGIN;
SELECT configured_max_ttl FROM lease.configure(max_ttl => interval '1 hour');
COMMIT;
SHOW synchronous_commit;
RESET synchronous_commit;

-- The same after a renewal and after a batch renewal, each in its own
-- transaction: the session's own off comes back.
SELECT epoch AS dur_e FROM lease.acquire('dur-session', 'o1', interval '30s') \gset
SET synchronous_commit = off;
SELECT status FROM lease.renew('dur-session', 'o1', :dur_e, interval '30s');
SHOW synchronous_commit;
SELECT key, status FROM lease.renew_many('{dur-session}', 'o1', ARRAY[:dur_e]::bigint[], interval '30s');
SHOW synchronous_commit;
RESET synchronous_commit;

-- upgrade_06_update_0_4_0: ALTER EXTENSION pg_lease UPDATE TO '0.4.0' (the
-- released direct script from 0.3.0, named) on the database that upgrade_04
-- left at 0.3.0, with rows that 0.1.0, 0.2.0 and 0.3.0 wrote in every state.
-- Every row of every state table survives, 0.3.0 grants keep their role
-- binding and epochs, counters continue. upgrade_07 updates this database
-- on to the current version.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- More states, made by 0.3.0: held (bound to a role), lapsed, lapsed and
-- taken over, force-released, free; a listener's registration.
SELECT lease.version();
CREATE ROLE regress_pglease_up6;
SET SESSION AUTHORIZATION regress_pglease_up6;
SELECT acquired, epoch FROM lease.acquire('up3-held', 'h3', interval '1h');
RESET SESSION AUTHORIZATION;
SELECT acquired, epoch FROM lease.acquire('up3-lapsed', 'l3', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up3-taken', 'l3', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up3-forced', 'x3', interval '1h');
SELECT released, epoch FROM lease.force_release('up3-forced');
SELECT acquired, epoch FROM lease.acquire('up3-free', 'f3', interval '1h');
SELECT status FROM lease.release('up3-free', 'f3', 1);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('up3-taken', 't3', interval '1h');
SELECT lease.listen('up3-held');
SELECT key, held, owner, epoch FROM lease.list() WHERE key LIKE 'up3-%' ORDER BY key;
CREATE TABLE upgrade_before_040 AS SELECT * FROM lease.leases;
CREATE TABLE upgrade_state_040 AS
  SELECT 'floor' AS t, row(f.*)::text AS r FROM lease.epoch_floor f
  UNION ALL SELECT 'timeline', row(s.*)::text FROM lease.timeline_state s
  UNION ALL SELECT 'settings', row(s.singleton, s.max_ttl, s.prev_max_ttl, s.prev_until)::text FROM lease.settings s
  UNION ALL SELECT 'listeners', row(w.pid, w.key)::text FROM lease.listeners w;

ALTER EXTENSION pg_lease UPDATE TO '0.4.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();

-- Every row of every state table as before, all columns, timestamps included
-- (the settings' columns of 0.3.0: 0.4.0 adds promotion, NULL for the default).
SELECT count(*) AS rows_before, (SELECT count(*) FROM lease.leases) AS rows_after FROM upgrade_before_040;
SELECT count(*) AS changed_rows FROM (
  (SELECT * FROM lease.leases EXCEPT ALL SELECT * FROM upgrade_before_040)
  UNION ALL
  (SELECT * FROM upgrade_before_040 EXCEPT ALL SELECT * FROM lease.leases)) d;
SELECT count(*) AS changed_state_rows FROM (
  (SELECT * FROM upgrade_state_040 EXCEPT ALL (
     SELECT 'floor' AS t, row(f.*)::text AS r FROM lease.epoch_floor f
     UNION ALL SELECT 'timeline', row(s.timeline, s.era, s.grace_until)::text FROM lease.timeline_state s
     UNION ALL SELECT 'settings', row(s.singleton, s.max_ttl, s.prev_max_ttl, s.prev_until)::text FROM lease.settings s
     UNION ALL SELECT 'listeners', row(w.pid, w.key)::text FROM lease.listeners w))) d;
SELECT extconfig::regclass[] AS config_tables, extcondition FROM pg_extension WHERE extname = 'pg_lease';

-- 0.3.0 grants: the holder's role renews, fences and releases; another role
-- presenting the same owner and epoch is refused.
CREATE ROLE regress_pglease_up6_other;
SET SESSION AUTHORIZATION regress_pglease_up6_other;
SELECT status FROM lease.renew('up3-held', 'h3', 1, interval '1h');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_up6;
SELECT status FROM lease.renew('up3-held', 'h3', 1, interval '1h');
SELECT lease.fence('up3-held', 'h3', 1) > clock_timestamp() AS fenced;
SELECT status FROM lease.renew('up3-lapsed', 'l3', 1, interval '1h');
SELECT status FROM lease.release('up3-held', 'h3', 1);
RESET SESSION AUTHORIZATION;
SELECT status FROM lease.renew('up3-taken', 'l3', 1, interval '1h');
SELECT status FROM lease.renew('up3-taken', 't3', 2, interval '1h');

-- Counters continue; a never-leased key starts at 1.
SELECT acquired, epoch FROM lease.acquire('up3-held', 'n4', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up3-lapsed', 'n4', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up3-forced', 'n4', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up3-free', 'n4', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up3-new', 'n4', interval '1h');
SELECT lease.unlisten('*');

-- 0.4.0's member objects.
SELECT object FROM upgrade_catalog() ORDER BY object;

-- Leave the rows for the regression suite without grants bound to a role
-- that other roles' tests would not expect.
SELECT count(*) AS released FROM lease.leases l, lease.release(l.key, l.owner, l.epoch) r
 WHERE l.key LIKE 'up3-%' AND l.owner IN ('n4', 't3') AND r.status = 'ok';
DROP TABLE upgrade_before_040, upgrade_state_040;
DROP ROLE regress_pglease_up6, regress_pglease_up6_other;

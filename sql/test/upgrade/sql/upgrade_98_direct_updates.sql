-- upgrade_98_direct_updates: runs after the regression suite. From each
-- released version before 0.3.0, a fresh CREATE EXTENSION of that version,
-- keys in every state, then ALTER EXTENSION pg_lease UPDATE: PostgreSQL takes
-- the direct update script (pg_lease--0.1.0--0.4.0.sql, pg_lease--0.2.0--
-- 0.4.0.sql), never the released ones. Every row survives, grants keep
-- working, and the catalog equals the one upgrade_06 saved after the update
-- from 0.3.0.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The update path each version takes to the default version: one step.
SELECT source, path FROM pg_extension_update_paths('pg_lease')
 WHERE target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease')
   AND source IN ('0.1.0', '0.2.0', '0.3.0')
 ORDER BY source;

-- From 0.1.0.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT acquired, epoch FROM lease.acquire('d1-held', 'h', interval '2h');
SELECT acquired, epoch FROM lease.acquire('d1-lapsed', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d1-taken', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d1-forced', 'x', interval '1h');
SELECT released, epoch FROM lease.force_release('d1-forced');
SELECT acquired, epoch FROM lease.acquire('d1-free', 'f', interval '1h');
SELECT status FROM lease.release('d1-free', 'f', 1);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('d1-taken', 't', interval '1h');
CREATE TABLE d1_before AS SELECT * FROM lease.leases;
ALTER EXTENSION pg_lease UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT count(*) AS changed_rows FROM (
  (SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases
   EXCEPT ALL SELECT * FROM d1_before)
  UNION ALL
  (SELECT * FROM d1_before EXCEPT ALL
   SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases)) d;
SELECT count(*) FILTER (WHERE holder_role IS NOT NULL) AS bound_rows, count(*) AS all_rows FROM lease.leases;
SELECT floor FROM lease.epoch_floor;
SELECT timeline, era, grace_until FROM lease.timeline_state;
-- The 2-hour grant is covered by the promotion grace.
SELECT promotion_grace > interval '1 hour 59 min' AS grace_covers_the_2h_grant FROM lease.status();
SELECT 'only after update from 0.1.0' AS side, object FROM (
  SELECT * FROM upgrade_catalog() EXCEPT SELECT * FROM upgrade_catalog_updated) u
UNION ALL
SELECT 'only after update from 0.3.0', object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog()) f
ORDER BY 1, 2;
SELECT status FROM lease.renew('d1-held', 'h', 1, interval '1h');
SELECT status FROM lease.renew('d1-lapsed', 'l', 1, interval '1h');
SELECT status FROM lease.renew('d1-taken', 'l', 1, interval '1h');
SELECT status FROM lease.release('d1-taken', 't', 2);
SELECT acquired, epoch FROM lease.acquire('d1-lapsed', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d1-taken', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d1-forced', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d1-free', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d1-new', 'n', interval '1h');
SELECT lease.listen('d1-new');
SELECT lease.unlisten('*');
DROP TABLE d1_before;

-- From 0.2.0, with a raised epoch floor.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.2.0';
SELECT acquired, epoch FROM lease.acquire('d2-gone', 'g', interval '1h');
SELECT status FROM lease.release('d2-gone', 'g', 1);
SELECT acquired, epoch FROM lease.acquire('d2-gone', 'g', interval '1h');
SELECT status FROM lease.release('d2-gone', 'g', 3);
SELECT removed, epoch_floor FROM lease.cleanup(interval '0');
SELECT acquired, epoch FROM lease.acquire('d2-held', 'h', interval '2h');
SELECT acquired, epoch FROM lease.acquire('d2-lapsed', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d2-taken', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d2-forced', 'x', interval '1h');
SELECT released, epoch FROM lease.force_release('d2-forced');
SELECT acquired, epoch FROM lease.acquire('d2-free', 'f', interval '1h');
SELECT status FROM lease.release('d2-free', 'f', 5);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('d2-taken', 't', interval '1h');
CREATE TABLE d2_before AS SELECT * FROM lease.leases;
ALTER EXTENSION pg_lease UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT count(*) AS changed_rows FROM (
  (SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases
   EXCEPT ALL SELECT * FROM d2_before)
  UNION ALL
  (SELECT * FROM d2_before EXCEPT ALL
   SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases)) d;
SELECT count(*) FILTER (WHERE holder_role IS NOT NULL) AS bound_rows, count(*) AS all_rows FROM lease.leases;
SELECT floor FROM lease.epoch_floor;
SELECT timeline, era, grace_until FROM lease.timeline_state;
SELECT promotion_grace > interval '1 hour 59 min' AS grace_covers_the_2h_grant FROM lease.status();
SELECT 'only after update from 0.2.0' AS side, object FROM (
  SELECT * FROM upgrade_catalog() EXCEPT SELECT * FROM upgrade_catalog_updated) u
UNION ALL
SELECT 'only after update from 0.3.0', object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog()) f
ORDER BY 1, 2;
SELECT status FROM lease.renew('d2-held', 'h', 5, interval '1h');
SELECT status FROM lease.renew('d2-lapsed', 'l', 5, interval '1h');
SELECT status FROM lease.release('d2-taken', 't', 6);
-- Counters continue; the removed key and a new key come back above the floor.
SELECT acquired, epoch FROM lease.acquire('d2-lapsed', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d2-forced', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d2-free', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d2-gone', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d2-new', 'n', interval '1h');
DROP TABLE d2_before;

-- upgrade_98_direct_updates: runs after the regression suite. From each
-- released version, a fresh CREATE EXTENSION of that version, keys in every
-- state, then ALTER EXTENSION pg_lease UPDATE: PostgreSQL takes the direct
-- update script to the current version (pg_lease--0.1.0--0.5.0.sql ...
-- pg_lease--0.4.0--0.5.0.sql), never a released one. Every row survives,
-- grants keep working, and the catalog equals the one upgrade_07 saved after
-- the chain 0.1.0 -> 0.2.0 -> 0.3.0 -> 0.4.0 -> current.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The update path each version takes to the default version: one step.
SELECT source, path FROM pg_extension_update_paths('pg_lease')
 WHERE target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease')
   AND source IN ('0.1.0', '0.2.0', '0.3.0', '0.4.0')
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
SELECT 'only after the chain', object FROM (
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
SELECT 'only after the chain', object FROM (
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

-- From 0.3.0 (created by name: 0.1.0 and the released updates), with a
-- grant bound to a role, a registration and a raised max_ttl.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.3.0';
CREATE ROLE regress_pglease_d3;
CREATE ROLE regress_pglease_d3_other;
SELECT * FROM lease.configure(interval '2 hours');
SET SESSION AUTHORIZATION regress_pglease_d3;
SELECT acquired, epoch FROM lease.acquire('d3-held', 'h', interval '90 min');
RESET SESSION AUTHORIZATION;
SELECT acquired, epoch FROM lease.acquire('d3-lapsed', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d3-taken', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d3-forced', 'x', interval '1h');
SELECT released, epoch FROM lease.force_release('d3-forced');
SELECT acquired, epoch FROM lease.acquire('d3-free', 'f', interval '1h');
SELECT status FROM lease.release('d3-free', 'f', 1);
SELECT lease.listen('d3-held');
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('d3-taken', 't', interval '1h');
CREATE TABLE d3_before AS
  SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch, holder_role FROM lease.leases;
CREATE TABLE d3_state AS
  SELECT 'floor' AS t, row(f.*)::text AS r FROM lease.epoch_floor f
  UNION ALL SELECT 'timeline', row(s.timeline, s.era, s.grace_until)::text FROM lease.timeline_state s
  UNION ALL SELECT 'settings', row(s.singleton, s.max_ttl, s.prev_max_ttl, s.prev_until)::text FROM lease.settings s
  UNION ALL SELECT 'listeners', row(w.pid, w.key, w.since)::text FROM lease.listeners w;
ALTER EXTENSION pg_lease UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT count(*) AS changed_rows FROM (
  (SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch, holder_role FROM lease.leases
   EXCEPT ALL SELECT * FROM d3_before)
  UNION ALL
  (SELECT * FROM d3_before EXCEPT ALL
   SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch, holder_role FROM lease.leases)) d;
SELECT count(*) AS changed_state_rows FROM (
  (SELECT * FROM d3_state EXCEPT ALL (
     SELECT 'floor' AS t, row(f.*)::text AS r FROM lease.epoch_floor f
     UNION ALL SELECT 'timeline', row(s.timeline, s.era, s.grace_until)::text FROM lease.timeline_state s
     UNION ALL SELECT 'settings', row(s.singleton, s.max_ttl, s.prev_max_ttl, s.prev_until)::text FROM lease.settings s
     UNION ALL SELECT 'listeners', row(w.pid, w.key, w.since)::text FROM lease.listeners w))) d;
SELECT configured_max_ttl FROM lease.configure();
SELECT 'only after update from 0.3.0' AS side, object FROM (
  SELECT * FROM upgrade_catalog() EXCEPT SELECT * FROM upgrade_catalog_updated) u
UNION ALL
SELECT 'only after the chain', object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog()) f
ORDER BY 1, 2;
SET SESSION AUTHORIZATION regress_pglease_d3_other;
SELECT status FROM lease.renew('d3-held', 'h', 1, interval '1h');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_d3;
SELECT status FROM lease.renew('d3-held', 'h', 1, interval '1h');
SELECT status FROM lease.release('d3-held', 'h', 1);
RESET SESSION AUTHORIZATION;
SELECT status FROM lease.renew('d3-lapsed', 'l', 1, interval '1h');
SELECT status FROM lease.renew('d3-taken', 'l', 1, interval '1h');
SELECT status FROM lease.release('d3-taken', 't', 2);
SELECT acquired, epoch FROM lease.acquire('d3-held', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d3-lapsed', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d3-taken', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d3-forced', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d3-free', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d3-new', 'n', interval '1h');
SELECT lease.unlisten('*');
DROP TABLE d3_before, d3_state;

-- From 0.4.0 (its full script), with its history, candidates, a strategy,
-- a registration and settings: the rows compared column by column as 0.4.0
-- has them (upgrade_state_rows(), from upgrade_07).
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.4.0';
SELECT configured_max_ttl, configured_promotion FROM lease.configure(max_ttl => interval '2 hours', promotion => 'synchronous');
SELECT history_rows FROM lease.configure_history(50);
SET SESSION AUTHORIZATION regress_pglease_d3;
SELECT acquired, epoch FROM lease.acquire('d4-held', 'h', interval '90 min');
SELECT status FROM lease.candidate('d4-held', 'c', interval '1h', version => '2.0.0');
SELECT previous FROM lease.set_strategy('d4-held', 'newest_version');
SELECT lease.listen('d4-held');
RESET SESSION AUTHORIZATION;
SELECT acquired, epoch FROM lease.acquire('d4-lapsed', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d4-taken', 'l', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('d4-forced', 'x', interval '1h');
SELECT released, epoch FROM lease.force_release('d4-forced');
SELECT acquired, epoch FROM lease.acquire('d4-free', 'f', interval '1h');
SELECT status FROM lease.release('d4-free', 'f', 1);
SELECT acquired, epoch FROM lease.acquire('d4-handed', 'a', interval '1h');
SELECT previous FROM lease.set_strategy('d4-handed', 'priority');
SELECT status FROM lease.candidate('d4-handed', 'b', interval '1h');
SELECT status FROM lease.release('d4-handed', 'a', 1);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('d4-taken', 't', interval '1h');
CREATE TABLE d4_before AS SELECT * FROM upgrade_state_rows();
SELECT t, count(*) AS rows_before FROM d4_before GROUP BY t ORDER BY t;
ALTER EXTENSION pg_lease UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT b.t, count(*) AS rows_changed_or_lost FROM d4_before b
 WHERE NOT EXISTS (
   SELECT 1 FROM upgrade_state_rows() a
    WHERE a.t = b.t
      AND NOT EXISTS (SELECT 1 FROM jsonb_each(b.r) c WHERE a.r -> c.key IS DISTINCT FROM c.value))
 GROUP BY b.t ORDER BY b.t;
SELECT t, count(*) AS rows_after FROM upgrade_state_rows() GROUP BY t
EXCEPT SELECT t, count(*) FROM d4_before GROUP BY t;
SELECT configured_max_ttl, configured_promotion FROM lease.configure();
SELECT 'only after update from 0.4.0' AS side, object FROM (
  SELECT * FROM upgrade_catalog() EXCEPT SELECT * FROM upgrade_catalog_updated) u
UNION ALL
SELECT 'only after the chain', object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog()) f
ORDER BY 1, 2;
SET SESSION AUTHORIZATION regress_pglease_d3_other;
SELECT status FROM lease.renew('d4-held', 'h', 1, interval '1h');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_d3;
SELECT status FROM lease.renew('d4-held', 'h', 1, interval '1h');
SELECT lease.withdraw('d4-held', 'c');
SELECT status FROM lease.release('d4-held', 'h', 1);
SELECT lease.unlisten('*');
RESET SESSION AUTHORIZATION;
SELECT status FROM lease.renew('d4-lapsed', 'l', 1, interval '1h');
SELECT status FROM lease.renew('d4-taken', 'l', 1, interval '1h');
SELECT status FROM lease.renew('d4-handed', 'b', 2, interval '1h');
SELECT acquired, epoch FROM lease.acquire('d4-held', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d4-lapsed', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d4-forced', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d4-free', 'n', interval '1h');
SELECT acquired, epoch FROM lease.acquire('d4-new', 'n', interval '1h');
SELECT lease.withdraw('d4-handed', 'b');
DROP TABLE d4_before;
DROP FUNCTION upgrade_state_rows();
DROP ROLE regress_pglease_d3, regress_pglease_d3_other;

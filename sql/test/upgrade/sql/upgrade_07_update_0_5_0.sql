-- upgrade_07_update_0_5_0: ALTER EXTENSION pg_lease UPDATE (0.4.0 to the
-- current version in one direct step) on the database that upgrade_06 left
-- at 0.4.0, with rows that every release wrote: keys in every state made by
-- 0.4.0 (held and bound to a role, lapsed, taken over, force-released,
-- released, handed over), their history, candidates and a strategy, a
-- listener's registration, and settings (max_ttl, promotion, history
-- retention). Every row of every state table survives in every 0.4.0 column,
-- grants keep working, counters and history go on, and the catalog is saved
-- for upgrade_98 and upgrade_99. Nothing printed here depends on what the
-- current version adds: the rows are compared column by column as 0.4.0 has
-- them, and the catalog only later, against a fresh install's.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT lease.version();
SELECT path FROM pg_extension_update_paths('pg_lease')
 WHERE source = '0.4.0' AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease');

-- The settings as the regression suite expects them, restored at the end.
CREATE TABLE upgrade_settings_06 AS SELECT singleton, max_ttl, prev_max_ttl, prev_until, promotion FROM lease.settings;
CREATE TABLE upgrade_history_settings_06 AS SELECT singleton, keep_rows FROM lease.history_settings;

-- States made by 0.4.0.
SELECT configured_max_ttl, configured_promotion FROM lease.configure(max_ttl => interval '2 hours', promotion => 'synchronous');
SELECT history_rows FROM lease.configure_history(50);
CREATE ROLE regress_pglease_up7;
CREATE ROLE regress_pglease_up7_other;
SET SESSION AUTHORIZATION regress_pglease_up7;
SELECT acquired, epoch FROM lease.acquire('up4-held', 'h4', interval '90 min');
SELECT status FROM lease.candidate('up4-held', 'c4', interval '1h', version => '1.2.0', priority => 5);
SELECT previous FROM lease.set_strategy('up4-held', 'newest_version');
SELECT lease.listen('up4-held');
RESET SESSION AUTHORIZATION;
SELECT acquired, epoch FROM lease.acquire('up4-lapsed', 'l4', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up4-taken', 'l4', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up4-forced', 'x4', interval '1h');
SELECT released, epoch FROM lease.force_release('up4-forced');
SELECT acquired, epoch FROM lease.acquire('up4-free', 'f4', interval '1h');
SELECT status FROM lease.release('up4-free', 'f4', 1);
SELECT acquired, epoch FROM lease.acquire('up4-handed', 'a4', interval '1h');
SELECT previous FROM lease.set_strategy('up4-handed', 'priority');
SELECT status FROM lease.candidate('up4-handed', 'b4', interval '1h');
SELECT status FROM lease.release('up4-handed', 'a4', 1);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('up4-taken', 't4', interval '1h');
SELECT key, state, owner, last_owner, epoch FROM lease.list() WHERE key LIKE 'up4-%' ORDER BY key;
SELECT key, event, owner, epoch, previous_owner FROM lease.history WHERE key LIKE 'up4-%' ORDER BY key, seq;

-- Every row of every state table (0.4.0's tables), as JSON: one object per
-- row, its 0.4.0 columns as keys. (upgrade_98 uses it too.)
CREATE FUNCTION upgrade_state_rows() RETURNS TABLE (t text, r jsonb)
LANGUAGE sql STABLE AS $$
  SELECT 'leases', to_jsonb(l) FROM lease.leases l
  UNION ALL SELECT 'epoch_floor', to_jsonb(f) FROM lease.epoch_floor f
  UNION ALL SELECT 'timeline_state', to_jsonb(s) FROM lease.timeline_state s
  UNION ALL SELECT 'settings', to_jsonb(s) FROM lease.settings s
  UNION ALL SELECT 'history', to_jsonb(h) FROM lease.history h
  UNION ALL SELECT 'history_settings', to_jsonb(s) FROM lease.history_settings s
  UNION ALL SELECT 'listeners', to_jsonb(w) FROM lease.listeners w
  UNION ALL SELECT 'candidates', to_jsonb(c) FROM lease.candidates c
  UNION ALL SELECT 'strategies', to_jsonb(s) FROM lease.strategies s
$$;
CREATE TABLE upgrade_before_050 AS SELECT * FROM upgrade_state_rows();
CREATE TABLE upgrade_config_040 AS SELECT unnest(extconfig)::regclass::text AS config_table
  FROM pg_extension WHERE extname = 'pg_lease';
SELECT t, count(*) AS rows_before FROM upgrade_before_050 GROUP BY t ORDER BY t;

ALTER EXTENSION pg_lease UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease') AS at_default_version,
       extversion
  FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();

-- Every row kept, each of its 0.4.0 columns unchanged (timestamps
-- included); no row more.
SELECT b.t, count(*) AS rows_changed_or_lost FROM upgrade_before_050 b
 WHERE NOT EXISTS (
   SELECT 1 FROM upgrade_state_rows() a
    WHERE a.t = b.t
      AND NOT EXISTS (SELECT 1 FROM jsonb_each(b.r) c WHERE a.r -> c.key IS DISTINCT FROM c.value))
 GROUP BY b.t ORDER BY b.t;
SELECT t, count(*) AS rows_after FROM upgrade_state_rows() GROUP BY t
EXCEPT SELECT t, count(*) FROM upgrade_before_050 GROUP BY t;
-- 0.4.0's configuration tables are still dumped with their rows.
SELECT config_table AS no_longer_dumped FROM upgrade_config_040
EXCEPT SELECT unnest(extconfig)::regclass::text FROM pg_extension WHERE extname = 'pg_lease';
SELECT configured_max_ttl, configured_promotion FROM lease.configure();

-- 0.4.0 grants: the holder's role renews, fences and releases; another role
-- presenting the same owner and epoch is refused; a lapsed holder is told so.
SET SESSION AUTHORIZATION regress_pglease_up7_other;
SELECT status FROM lease.renew('up4-held', 'h4', 1, interval '1h');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_up7;
SELECT status FROM lease.renew('up4-held', 'h4', 1, interval '1h');
SELECT lease.fence('up4-held', 'h4', 1) > clock_timestamp() AS fenced;
RESET SESSION AUTHORIZATION;
SELECT status FROM lease.renew('up4-lapsed', 'l4', 1, interval '1h');
SELECT status FROM lease.renew('up4-taken', 'l4', 1, interval '1h');
SELECT status FROM lease.renew('up4-taken', 't4', 2, interval '1h');
SELECT status FROM lease.renew('up4-handed', 'b4', 2, interval '1h');

-- Counters continue, a never-leased key starts at 1, and each key's
-- history goes on after its 0.4.0 events.
SELECT acquired, epoch FROM lease.acquire('up4-lapsed', 'n5', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up4-forced', 'n5', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up4-free', 'n5', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up4-new', 'n5', interval '1h');
SELECT key, event, owner, epoch FROM lease.history h
 WHERE key IN ('up4-free', 'up4-new')
   AND seq > coalesce((SELECT max((b.r ->> 'seq')::bigint) FROM upgrade_before_050 b
                        WHERE b.t = 'history' AND b.r ->> 'key' = h.key), 0)
 ORDER BY key, seq;

-- The catalog after the update, for upgrade_98 and upgrade_99.
CREATE TABLE upgrade_catalog_updated AS SELECT * FROM upgrade_catalog();
SELECT count(*) > 0 AS saved FROM upgrade_catalog_updated;

-- Leave the database as the regression suite expects it: no candidate,
-- strategy, registration or grant of these keys, the settings of before.
SET SESSION AUTHORIZATION regress_pglease_up7;
SELECT lease.withdraw('up4-held', 'c4');
SELECT previous FROM lease.set_strategy('up4-held', 'any');
SELECT status FROM lease.release('up4-held', 'h4', 1);
SELECT lease.unlisten('*');
RESET SESSION AUTHORIZATION;
SELECT lease.withdraw('up4-handed', 'b4');
SELECT previous FROM lease.set_strategy('up4-handed', 'any');
SELECT count(*) AS released FROM lease.leases l, lease.release(l.key, l.owner, l.epoch) r
 WHERE l.key LIKE 'up4-%' AND l.owner IS NOT NULL AND r.status = 'ok';
DELETE FROM lease.settings;
INSERT INTO lease.settings (singleton, max_ttl, prev_max_ttl, prev_until, promotion)
  SELECT singleton, max_ttl, prev_max_ttl, prev_until, promotion FROM upgrade_settings_06;
DELETE FROM lease.history_settings;
INSERT INTO lease.history_settings (singleton, keep_rows) SELECT singleton, keep_rows FROM upgrade_history_settings_06;
SELECT count(*) AS candidates, (SELECT count(*) FROM lease.strategies) AS strategies,
       (SELECT count(*) FROM lease.listeners) AS registrations
  FROM lease.candidates;
DROP TABLE upgrade_before_050, upgrade_config_040, upgrade_settings_06, upgrade_history_settings_06;
DROP ROLE regress_pglease_up7, regress_pglease_up7_other;

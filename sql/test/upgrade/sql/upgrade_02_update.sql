-- upgrade_02_update: ALTER EXTENSION pg_lease UPDATE on the database that
-- upgrade_01_install_0_1_0 left at 0.1.0. Every row survives unchanged, the
-- grants made by 0.1.0 keep working with their epochs, the counters continue,
-- and what 0.2.0 adds works on the old rows. The database is left with those
-- rows (and no epoch floor) for the regression suite that runs after this.
\set VERBOSITY default
\set SHOW_CONTEXT never

ALTER EXTENSION pg_lease UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();

-- Every row exactly as before the update (all columns, timestamps included).
SELECT count(*) AS rows_before, (SELECT count(*) FROM lease.leases) AS rows_after FROM upgrade_before;
SELECT count(*) AS changed_rows FROM (
  (SELECT * FROM lease.leases EXCEPT ALL SELECT * FROM upgrade_before)
  UNION ALL
  (SELECT * FROM upgrade_before EXCEPT ALL SELECT * FROM lease.leases)) d;
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;
SELECT * FROM lease.epoch_floor;

-- Grants made by 0.1.0 renew, fence and release with their epochs.
SELECT status, expires_at > clock_timestamp() + interval '1h 59m' AS extended
  FROM lease.renew('up-held', 'h1', 1, interval '2h');
SELECT lease.fence('up-held3', 'h3', 3) > clock_timestamp() AS fenced;
SELECT status FROM lease.renew('up-held3', 'h3', 1, interval '1h');
SELECT status FROM lease.release('up-held3', 'h3', 3);
-- Holders whose 0.1.0 grants lapsed are told so (also the one a takeover
-- ended); the holder that took over renews.
SELECT status FROM lease.renew('up-lapsed', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up-taken', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up-taken', 't2', 2, interval '1h');
SELECT status FROM lease.renew('up-free', 'f1', 1, interval '1h');

-- Counters continue where 0.1.0 left them; a never-leased key starts at 1.
SELECT acquired, epoch FROM lease.acquire('up-lapsed', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-free', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-busy', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-held3', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-forced', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-new', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-held', 'n1', interval '1h');
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;

-- lease.cleanup (new in 0.2.0) on rows 0.1.0 wrote: keys freed come back
-- above every epoch they had. In a transaction that is rolled back, so that
-- the epoch floor stays 0 for the regression suite that runs next in this
-- database (its first grants expect epoch 1).
BEGIN;
SELECT status FROM lease.release('up-busy', 'n1', 11);
SELECT status FROM lease.release('up-forced', 'n1', 3);
SELECT * FROM lease.cleanup(interval '0');
SELECT key FROM lease.list() ORDER BY key;
SELECT acquired, epoch FROM lease.acquire('up-forced', 'n2', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-busy', 'n2', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-other-new', 'n2', interval '1h');
ROLLBACK;
SELECT * FROM lease.epoch_floor;

-- The updated extension's catalog entries, for upgrade_99_catalog to compare
-- with a fresh CREATE EXTENSION: every member object with its definition,
-- owner, privileges and comment. The row types of the extension's tables and
-- their array types are left out: they follow from the tables, and only some
-- majors record them as extension members (17 and 18 do, 14 to 16 do not).
CREATE FUNCTION upgrade_catalog() RETURNS TABLE (object text, definition text)
LANGUAGE sql STABLE AS $$
  SELECT pg_describe_object(d.classid, d.objid, 0),
         CASE d.classid
           WHEN 'pg_proc'::regclass THEN (
             SELECT pg_get_functiondef(p.oid) || ' owner ' || p.proowner::regrole
                    || ' acl ' || coalesce(p.proacl::text, '-')
                    || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
               FROM pg_proc p WHERE p.oid = d.objid)
           WHEN 'pg_class'::regclass THEN (
             SELECT c.relkind::text || ' owner ' || c.relowner::regrole
                    || ' acl ' || coalesce(c.relacl::text, '-')
                    || ' options ' || coalesce(c.reloptions::text, '-')
                    || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
                    || ' columns ' || (
                      SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                        || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                        || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''),
                                        ', ' ORDER BY a.attnum)
                        FROM pg_attribute a
                        LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                       WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
                    || ' constraints ' || coalesce((
                      SELECT string_agg(co.conname || ' ' || pg_get_constraintdef(co.oid), ', ' ORDER BY co.conname)
                        FROM pg_constraint co WHERE co.conrelid = c.oid), '-')
                    || ' indexes ' || coalesce((
                      SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY i.indexrelid::regclass::text)
                        FROM pg_index i WHERE i.indrelid = c.oid), '-')
               FROM pg_class c WHERE c.oid = d.objid)
           WHEN 'pg_namespace'::regclass THEN (
             SELECT 'owner ' || n.nspowner::regrole || ' acl ' || coalesce(n.nspacl::text, '-')
                    || ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
               FROM pg_namespace n WHERE n.oid = d.objid)
           WHEN 'pg_type'::regclass THEN (
             SELECT t.typtype::text || ' owner ' || t.typowner::regrole
                    || ' acl ' || coalesce(t.typacl::text, '-')
               FROM pg_type t WHERE t.oid = d.objid)
           ELSE 'member of an unexpected kind'
         END
    FROM pg_depend d
   WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
     AND d.refobjid = (SELECT e.oid FROM pg_extension e WHERE e.extname = 'pg_lease')
     AND NOT (d.classid = 'pg_type'::regclass AND EXISTS (
           SELECT 1 FROM pg_type t
             JOIN pg_class r ON r.oid = coalesce(nullif(t.typrelid, 0),
                                                 (SELECT e.typrelid FROM pg_type e WHERE e.oid = t.typelem))
            WHERE t.oid = d.objid AND r.relkind <> 'c'))
$$;
CREATE TABLE upgrade_catalog_updated AS SELECT * FROM upgrade_catalog();
SELECT object FROM upgrade_catalog_updated ORDER BY object;

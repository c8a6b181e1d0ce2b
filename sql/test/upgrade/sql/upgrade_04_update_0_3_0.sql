-- upgrade_04_update_0_3_0: ALTER EXTENSION pg_lease UPDATE TO '0.3.0' on the
-- database that upgrade_02_update left at 0.2.0, with the rows 0.1.0 and 0.2.0
-- wrote in every state. Every row survives with all its columns (the new
-- holder_role is NULL: those grants are bound to no role), the 0.2.0 grants
-- keep working with their epochs, the counters continue in era 0 (a cluster
-- that never failed over: 1, 2, 3 ...), and the timeline is recorded.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- More states, made by 0.2.0: lapsed, lapsed and taken over, force-released,
-- free; held ones are left by upgrade_02 (up-held, up-lapsed ... held by n1).
SELECT lease.version();
SELECT acquired, epoch FROM lease.acquire('up2-lapsed', 'l1', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up2-taken', 'l1', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up2-forced', 'x1', interval '1h');
SELECT released, epoch FROM lease.force_release('up2-forced');
SELECT acquired, epoch FROM lease.acquire('up2-free', 'f1', interval '1h');
SELECT status FROM lease.release('up2-free', 'f1', 1);
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('up2-taken', 't2', interval '1h');
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;
CREATE TABLE upgrade_before_030 AS SELECT * FROM lease.leases;

ALTER EXTENSION pg_lease UPDATE TO '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();

-- Every row as before, all old columns (timestamps included); holder_role NULL.
SELECT count(*) AS rows_before, (SELECT count(*) FROM lease.leases) AS rows_after FROM upgrade_before_030;
SELECT count(*) AS changed_rows FROM (
  (SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases
   EXCEPT ALL SELECT * FROM upgrade_before_030)
  UNION ALL
  (SELECT * FROM upgrade_before_030 EXCEPT ALL
   SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases)) d;
SELECT count(*) FILTER (WHERE holder_role IS NOT NULL) AS bound_rows FROM lease.leases;
SELECT floor FROM lease.epoch_floor;
-- The timeline is recorded (a fresh cluster: 1), era 0, no grace.
SELECT timeline, era, grace_until FROM lease.timeline_state;
SELECT max_ttl, timeline, era, grace_until, epoch_floor FROM lease.status();
-- up-held was renewed for 2 hours by 0.2.0: the promotion grace covers it
-- (longer than the new default max_ttl of 1 hour) until it ends.
SELECT promotion_grace > interval '1 hour 59 min' AS grace_covers_the_2h_grant,
       promotion_grace <= interval '2 hours' AS no_longer FROM lease.status();

-- The state tables are configuration tables: pg_dump keeps their rows.
SELECT extconfig::regclass[] AS config_tables, extcondition FROM pg_extension WHERE extname = 'pg_lease';

-- 0.2.0 grants renew, fence and release with their epochs, from any role
-- (not bound); statuses as before.
SELECT status FROM lease.renew('up-held', 'h1', 1, interval '1h');
SELECT lease.fence('up-held', 'h1', 1) > clock_timestamp() AS fenced;
SELECT status FROM lease.renew('up2-lapsed', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up2-taken', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up2-taken', 't2', 2, interval '1h');
SELECT status FROM lease.renew('up2-free', 'f1', 1, interval '1h');
CREATE ROLE regress_pglease_up4;
SET SESSION AUTHORIZATION regress_pglease_up4;
SELECT status FROM lease.release('up2-taken', 't2', 2);
RESET SESSION AUTHORIZATION;
DROP ROLE regress_pglease_up4;

-- Counters continue; a never-leased key starts at 1; new grants are bound to
-- the session user.
SELECT acquired, epoch FROM lease.acquire('up2-lapsed', 'n3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up2-taken', 'n3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up2-forced', 'n3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up2-free', 'n3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up2-new', 'n3', interval '1h');
SELECT key, epoch, holder_role FROM lease.leases WHERE key LIKE 'up2-%' ORDER BY key;
-- Leave the rows of upgrade_02 and these for the regression suite, without
-- bound grants that other roles' tests would not expect.
SELECT count(*) AS released FROM lease.leases l, lease.release(l.key, l.owner, l.epoch) r
 WHERE l.key LIKE 'up2-%' AND l.owner = 'n3' AND r.status = 'ok';

-- The extension's catalog entries: upgrade_06 saves them after the update to
-- the current version, upgrade_98 and upgrade_99 compare other installs with
-- them: every member object with its definition,
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
DROP TABLE upgrade_before_030;

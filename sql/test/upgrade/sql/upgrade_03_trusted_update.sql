-- upgrade_03_trusted_update: a non-superuser with only CREATE on a database
-- installs 0.1.0 and updates it (0.1.0 -> 0.2.0 -> 0.3.0) itself. What the
-- updates add (lease.epoch_floor, lease.cleanup; 0.3.0's lease.timeline_state,
-- lease.settings, lease.configure) belongs to that role, like everything
-- else, and is closed to other roles. Database and roles are dropped at the
-- end.
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT current_database() AS orig_db, current_user AS orig_user \gset

CREATE ROLE regress_pglease_upgrader LOGIN;
CREATE ROLE regress_pglease_upother LOGIN;
CREATE DATABASE regress_pglease_updb;
REVOKE ALL ON DATABASE regress_pglease_updb FROM PUBLIC;
GRANT CONNECT ON DATABASE regress_pglease_updb TO regress_pglease_upother;
GRANT CONNECT, CREATE ON DATABASE regress_pglease_updb TO regress_pglease_upgrader;

\c regress_pglease_updb regress_pglease_upgrader
SELECT rolsuper FROM pg_roles WHERE rolname = current_user;
CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT acquired, epoch FROM lease.acquire('upt-1', 'u1', interval '1h');
SELECT status FROM lease.release('upt-1', 'u1', 1);
ALTER EXTENSION pg_lease UPDATE;
SELECT extversion, extowner::regrole FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();
SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'lease' ORDER BY 1;
SELECT count(*) AS functions_not_owned_by_upgrader
  FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
   AND proowner <> 'regress_pglease_upgrader'::regrole;
SELECT prosecdef, proconfig FROM pg_proc
 WHERE pronamespace = 'lease'::regnamespace AND proname = 'cleanup';
-- The owner cleans up: the freed key comes back above its epoch.
SELECT * FROM lease.cleanup(interval '0');
SELECT acquired, epoch FROM lease.acquire('upt-1', 'u1', interval '1h');

-- Another role uses the API but not cleanup nor the floor table.
\c regress_pglease_updb regress_pglease_upother
SELECT acquired, epoch FROM lease.acquire('upt-2', 'o1', interval '1h');
SELECT * FROM lease.cleanup(interval '0');
SELECT * FROM lease.epoch_floor;
UPDATE lease.epoch_floor SET floor = 0;

-- A superuser runs the update of a non-superuser's install: what the update
-- adds still belongs to the installer, never to the superuser (lease.cleanup
-- is SECURITY DEFINER and calls helpers the installer owns and could replace).
\c :orig_db :orig_user
CREATE DATABASE regress_pglease_updb2;
GRANT CONNECT, CREATE ON DATABASE regress_pglease_updb2 TO regress_pglease_upgrader;
\c regress_pglease_updb2 regress_pglease_upgrader
CREATE EXTENSION pg_lease VERSION '0.1.0';
-- The installer has revoked some of its own privileges (an owner may): the
-- update gives them back, the owner keeps every privilege on its objects.
REVOKE SELECT, UPDATE ON lease.leases FROM regress_pglease_upgrader;
REVOKE EXECUTE ON FUNCTION lease.force_release(text) FROM regress_pglease_upgrader;
SELECT has_table_privilege('lease.leases', 'SELECT') AS can_select,
       has_table_privilege('lease.leases', 'UPDATE') AS can_update,
       has_function_privilege('lease.force_release(text)', 'EXECUTE') AS can_force_release;
\c regress_pglease_updb2 :orig_user
SELECT rolsuper FROM pg_roles WHERE rolname = current_user;
ALTER EXTENSION pg_lease UPDATE;
SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'lease' ORDER BY 1;
SELECT count(*) AS functions_not_owned_by_upgrader
  FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
   AND proowner <> 'regress_pglease_upgrader'::regrole;
-- Every privilege of every table, function and the schema is the owner's.
SELECT kind, obj, priv AS missing_privilege FROM (
    SELECT 'table' AS kind, c.oid::regclass::text AS obj, p AS priv,
           has_table_privilege('regress_pglease_upgrader', c.oid, p) AS has
      FROM pg_class c, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
     WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'
    UNION ALL
    SELECT 'function', f.oid::regprocedure::text, 'EXECUTE',
           has_function_privilege('regress_pglease_upgrader', f.oid, 'EXECUTE')
      FROM pg_proc f WHERE f.pronamespace = 'lease'::regnamespace
    UNION ALL
    SELECT 'schema', 'lease', p, has_schema_privilege('regress_pglease_upgrader', 'lease', p)
      FROM unnest(ARRAY['USAGE', 'CREATE']) p) x
 WHERE NOT has ORDER BY 1, 2, 3;
\c :orig_db :orig_user
DROP DATABASE regress_pglease_updb2;

\c :orig_db :orig_user
DROP DATABASE regress_pglease_updb;
DROP ROLE regress_pglease_upgrader;
DROP ROLE regress_pglease_upother;

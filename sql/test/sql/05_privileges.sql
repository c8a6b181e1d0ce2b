-- 05_privileges: trusted install by a non-superuser, and what other roles can
-- and cannot do. Roles and the database are created here and dropped at the end.
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT current_database() AS orig_db, current_user AS orig_user \gset

CREATE ROLE regress_pglease_installer LOGIN;
CREATE ROLE regress_pglease_other LOGIN;
CREATE DATABASE regress_pglease_db;
REVOKE ALL ON DATABASE regress_pglease_db FROM PUBLIC;
GRANT CONNECT ON DATABASE regress_pglease_db TO regress_pglease_other;
GRANT CONNECT, CREATE ON DATABASE regress_pglease_db TO regress_pglease_installer;

-- A non-superuser with only CREATE on the database installs the extension
-- (trusted = true in the control file).
\c regress_pglease_db regress_pglease_installer
SELECT rolsuper FROM pg_roles WHERE rolname = current_user;
CREATE EXTENSION pg_lease;

-- After a trusted install the script runs as the bootstrap superuser, but it
-- ALTERs the ownership of every object to @extowner@, the installing role: the
-- extension, schema lease, table lease.leases and every function belong to
-- regress_pglease_installer, so the SECURITY DEFINER functions run with the
-- installer's privileges, not a superuser's.
SELECT extowner::regrole FROM pg_extension WHERE extname = 'pg_lease';
SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'lease';
SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'lease' ORDER BY 1;
SELECT DISTINCT proowner::regrole, prosecdef, proconfig[1] AS pinned
  FROM pg_proc WHERE pronamespace = 'lease'::regnamespace AND proname !~ '^_'
   AND proname <> 'version';
-- The calls on a handoff's path also plan generically (once per connection).
SELECT proname, proconfig[2] AS planning
  FROM pg_proc WHERE pronamespace = 'lease'::regnamespace AND array_length(proconfig, 1) > 1
 ORDER BY 1;
SELECT count(*) AS functions_not_owned_by_installer
  FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
   AND proowner <> 'regress_pglease_installer'::regrole;

-- The installer uses the API and can read its table.
SELECT acquired, epoch FROM lease.acquire('priv-1', 'installer', interval '30s');
SELECT key, owner, epoch FROM lease.leases ORDER BY key;

-- Another role with no grants at all uses every function of the API ...
\c regress_pglease_db regress_pglease_other
SELECT acquired, epoch FROM lease.acquire('priv-2', 'other', interval '30s');
SELECT status FROM lease.renew('priv-2', 'other', 1, interval '30s');
SELECT lease.fence('priv-2', 'other', 1) > clock_timestamp() AS fenced;
SELECT status FROM lease.release('priv-2', 'other', 1);
SELECT acquired, epoch FROM lease.acquire('priv-1', 'other', interval '30s');
SELECT held, owner, epoch FROM lease.inspect('priv-1');
SELECT key, held, owner, epoch FROM lease.list();
SELECT lease.version();
-- ... but cannot touch the table, the internal helpers or force_release,
SELECT * FROM lease.leases;
SELECT count(*) FROM lease.leases;
UPDATE lease.leases SET epoch = 1;
DELETE FROM lease.leases;
INSERT INTO lease.leases VALUES ('priv-3', 'other', 1, now(), now());
SELECT lease._changed('released', 'priv-1', 'other', 1);
SELECT * FROM lease.force_release('priv-1');
-- nor create objects in schema lease.
CREATE FUNCTION lease.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT now() $$;
SELECT held, owner, epoch FROM lease.inspect('priv-1');

-- force_release works once the installer grants EXECUTE on it: it ends the
-- grant and increments the epoch, and the former holder is fenced.
\c regress_pglease_db regress_pglease_installer
GRANT EXECUTE ON FUNCTION lease.force_release(text) TO regress_pglease_other;
\c regress_pglease_db regress_pglease_other
SELECT released, previous_owner, epoch FROM lease.force_release('priv-1');
SELECT held, owner, epoch FROM lease.inspect('priv-1');
SELECT status FROM lease.renew('priv-1', 'installer', 1, interval '30s');
-- the grant of EXECUTE gives no access to the table
SELECT count(*) FROM lease.leases;

\c :orig_db :orig_user
DROP DATABASE regress_pglease_db;
DROP ROLE regress_pglease_installer;
DROP ROLE regress_pglease_other;

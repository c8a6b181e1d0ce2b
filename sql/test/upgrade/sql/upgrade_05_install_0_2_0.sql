-- upgrade_05_install_0_2_0: CREATE EXTENSION pg_lease VERSION '0.2.0' in a
-- database of its own, with keys in every state and an epoch floor above 0
-- (clean-up ran), and an installing role whose default privileges leak into
-- 0.2.0's objects. ALTER EXTENSION UPDATE keeps every
-- row and the floor, and takes back every privilege the defaults gave away.
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT current_database() AS orig_db, current_user AS orig_user \gset

CREATE ROLE regress_pglease_app_rw LOGIN;
CREATE DATABASE regress_pglease_up5;
\c regress_pglease_up5
-- The installing role (this superuser) grants everything it creates to app_rw.
ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO regress_pglease_app_rw;
ALTER DEFAULT PRIVILEGES GRANT ALL ON FUNCTIONS TO regress_pglease_app_rw;
ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO regress_pglease_app_rw;
CREATE EXTENSION pg_lease VERSION '0.2.0';
SELECT lease.version();

-- Every state, then clean-up of the two oldest free keys (u5-free, u5-gone):
-- floor 6; u5-lapsed stays lapsed.
SELECT acquired, epoch FROM lease.acquire('u5-held', 'h1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('u5-free', 'f1', interval '1h');
SELECT status FROM lease.release('u5-free', 'f1', 1);
SELECT acquired, epoch FROM lease.acquire('u5-gone', 'g1', interval '1h');
SELECT status FROM lease.release('u5-gone', 'g1', 1);
SELECT acquired, epoch FROM lease.acquire('u5-gone', 'g1', interval '1h');
SELECT status FROM lease.release('u5-gone', 'g1', 3);
SELECT acquired, epoch FROM lease.acquire('u5-gone', 'g1', interval '1h');
SELECT status FROM lease.release('u5-gone', 'g1', 5);          -- counter 6
-- Acquired after u5-gone's release, so it lapses after it whatever the load:
-- cleanup removes the oldest free keys first.
SELECT acquired, epoch FROM lease.acquire('u5-lapsed', 'l1', interval '200ms');
SELECT pg_sleep(0.3);
SELECT * FROM lease.cleanup(interval '0', 2);
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;
SELECT floor FROM lease.epoch_floor;
CREATE TABLE before_u5 AS SELECT * FROM lease.leases;

-- The leak in 0.2.0: app_rw may write the table and run the operator functions.
SELECT has_table_privilege('regress_pglease_app_rw', 'lease.leases', 'UPDATE') AS leases_update,
       has_table_privilege('regress_pglease_app_rw', 'lease.epoch_floor', 'UPDATE') AS floor_update,
       has_function_privilege('regress_pglease_app_rw', 'lease.cleanup(interval, integer)', 'EXECUTE') AS cleanup;

ALTER EXTENSION pg_lease UPDATE;
SELECT lease.version();
SELECT count(*) AS changed_rows FROM (
  (SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases
   EXCEPT ALL SELECT * FROM before_u5)
  UNION ALL
  (SELECT * FROM before_u5 EXCEPT ALL
   SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch FROM lease.leases)) d;
SELECT epoch_floor, era FROM lease.status();
-- A removed key and a new key start above the floor; the others continue.
SELECT acquired, epoch FROM lease.acquire('u5-gone', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('u5-new', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('u5-lapsed', 'n1', interval '1h');
SELECT status FROM lease.renew('u5-held', 'h1', 1, interval '1h');

-- No privilege left to app_rw but EXECUTE on the API and USAGE on the schema,
-- on any object of schema lease (tables, every function, the schema).
SELECT c.relname, has_table_privilege('regress_pglease_app_rw', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') AS any_privilege
  FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r' ORDER BY 1;
SELECT p.proname, has_function_privilege('regress_pglease_app_rw', p.oid, 'EXECUTE') AS execute
  FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace ORDER BY 1;
SELECT has_schema_privilege('regress_pglease_app_rw', 'lease', 'USAGE') AS usage,
       has_schema_privilege('regress_pglease_app_rw', 'lease', 'CREATE') AS create;
-- No ACL names app_rw at all.
SELECT count(*) AS acl_entries_for_app_rw FROM (
  SELECT (aclexplode(relacl)).grantee FROM pg_class WHERE relnamespace = 'lease'::regnamespace
  UNION ALL SELECT (aclexplode(proacl)).grantee FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
  UNION ALL SELECT (aclexplode(nspacl)).grantee FROM pg_namespace WHERE nspname = 'lease') g
 WHERE grantee = 'regress_pglease_app_rw'::regrole;
\c regress_pglease_up5 regress_pglease_app_rw
UPDATE lease.leases SET epoch = 1;
SELECT * FROM lease.cleanup(interval '0');
SELECT * FROM lease.force_release('u5-held');
SELECT * FROM lease.configure(max_ttl => interval '1 year');
SELECT lease._changed('released', 'u5-held', 'h1', 1);

-- A fresh CREATE EXTENSION (0.3.0) under the same default privileges: the
-- same, nothing leaks.
\c regress_pglease_up5 :orig_user
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT count(*) AS acl_entries_for_app_rw FROM (
  SELECT (aclexplode(relacl)).grantee FROM pg_class WHERE relnamespace = 'lease'::regnamespace
  UNION ALL SELECT (aclexplode(proacl)).grantee FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
  UNION ALL SELECT (aclexplode(nspacl)).grantee FROM pg_namespace WHERE nspname = 'lease') g
 WHERE grantee = 'regress_pglease_app_rw'::regrole;

\c :orig_db :orig_user
DROP DATABASE regress_pglease_up5;
DROP ROLE regress_pglease_app_rw;

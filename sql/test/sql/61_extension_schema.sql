\set VERBOSITY default
\set SHOW_CONTEXT never
-- CREATE EXTENSION without SCHEMA records pg_lease in the first schema of
-- search_path. A schema that another role created there (the installer's
-- "$user" schema, say) would let that role drop pg_lease with every lease:
-- the 0.5.0 script refuses it, at install and at update.
CREATE ROLE regress_pglease_squatter;
SELECT format('GRANT CREATE ON DATABASE %I TO regress_pglease_squatter', current_database()) \gexec
SET ROLE regress_pglease_squatter;
CREATE SCHEMA regress_squat;
RESET ROLE;
DROP EXTENSION pg_lease;
SET search_path = regress_squat, public;
CREATE EXTENSION pg_lease;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'pg_lease';
-- A released version (no check) lands there; its update refuses.
CREATE EXTENSION pg_lease VERSION '0.4.0';
ALTER EXTENSION pg_lease UPDATE;
\echo :LAST_ERROR_SQLSTATE
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
DROP EXTENSION pg_lease;
-- Named explicitly, a schema of the installer's is fine.
CREATE EXTENSION pg_lease SCHEMA pg_catalog;
SELECT extversion, extnamespace::regnamespace FROM pg_extension WHERE extname = 'pg_lease';
RESET search_path;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'pg_lease';
DROP SCHEMA regress_squat;
SELECT format('REVOKE CREATE ON DATABASE %I FROM regress_pglease_squatter', current_database()) \gexec
DROP ROLE regress_pglease_squatter;

-- upgrade_99_catalog: runs last, after the regression suite. The catalog
-- entries of the extension as ALTER EXTENSION UPDATE left it (saved by
-- upgrade_04_update_0_3_0) equal those of a fresh CREATE EXTENSION pg_lease:
-- same member objects, definitions, owners, privileges and comments. (Today
-- CREATE EXTENSION itself reaches 0.3.0 through the same update scripts, as
-- there is no pg_lease--0.2.0.sql nor pg_lease--0.3.0.sql; this is the guard
-- for the day a full install script of a later version is added.)
\set VERBOSITY default
\set SHOW_CONTEXT never

DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT lease.version();
CREATE TABLE upgrade_catalog_fresh AS SELECT * FROM upgrade_catalog();
SELECT count(*) AS members FROM upgrade_catalog_fresh;
-- Differences (none expected): the objects whose entry is only on one side.
SELECT 'only after update' AS side, object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog_fresh) u
UNION ALL
SELECT 'only in fresh install', object FROM (
  SELECT * FROM upgrade_catalog_fresh EXCEPT SELECT * FROM upgrade_catalog_updated) f
ORDER BY 1, 2;

DROP TABLE upgrade_catalog_fresh, upgrade_catalog_updated, upgrade_before;
DROP FUNCTION upgrade_catalog();

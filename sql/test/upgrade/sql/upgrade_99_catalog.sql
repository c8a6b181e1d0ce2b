-- upgrade_99_catalog: runs last, after the regression suite. The catalog
-- entries of the extension as the update chain left it (0.1.0, the released
-- updates to 0.2.0, 0.3.0 and 0.4.0, then the update to the current version;
-- saved by upgrade_07_update_0_5_0) equal those of a fresh CREATE EXTENSION
-- pg_lease, which runs the full install script alone: same member objects,
-- definitions, owners, privileges and comments.
\set VERBOSITY default
\set SHOW_CONTEXT never

DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT lease.version();
CREATE TABLE upgrade_catalog_fresh AS SELECT * FROM upgrade_catalog();
SELECT count(*) > 0 AS members, count(*) = (SELECT count(*) FROM upgrade_catalog_updated) AS as_many_as_updated
  FROM upgrade_catalog_fresh;
-- Differences (none expected): the objects whose entry is only on one side.
SELECT 'only after update' AS side, object FROM (
  SELECT * FROM upgrade_catalog_updated EXCEPT SELECT * FROM upgrade_catalog_fresh) u
UNION ALL
SELECT 'only in fresh install', object FROM (
  SELECT * FROM upgrade_catalog_fresh EXCEPT SELECT * FROM upgrade_catalog_updated) f
ORDER BY 1, 2;

DROP TABLE upgrade_catalog_fresh, upgrade_catalog_updated, upgrade_before;
DROP FUNCTION upgrade_catalog();

-- 08_drop_recreate: DROP EXTENSION removes schema lease with every lease row;
-- a re-install starts every key at epoch 1.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('drop-1', 'o1', interval '30s');
SELECT status FROM lease.release('drop-1', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('drop-1', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('drop-2', 'o1', interval '30s');

DROP EXTENSION pg_lease;
SELECT count(*) AS lease_schemas FROM pg_namespace WHERE nspname = 'lease';
SELECT count(*) AS lease_tables FROM pg_class WHERE relname = 'leases';
SELECT count(*) AS lease_functions FROM pg_proc
 WHERE proname IN ('acquire', 'renew', 'release', 'inspect', 'list', 'fence', 'force_release');
SELECT * FROM lease.inspect('drop-1');

CREATE EXTENSION pg_lease;
SELECT count(*) AS rows_after_reinstall FROM lease.list();
SELECT held, owner, epoch FROM lease.inspect('drop-1');
SELECT acquired, epoch FROM lease.acquire('drop-1', 'o2', interval '30s');
SELECT acquired, epoch FROM lease.acquire('drop-2', 'o1', interval '30s');
SELECT status FROM lease.release('drop-1', 'o2', 1);
SELECT held, epoch FROM lease.inspect('drop-1');

-- 17_listen (0.3.0, SQL half): lease.listen / lease.unlisten
-- register and drop this backend's interest in a key ('*': every key), for
-- pg_lease.notify = 'waiters'. Invalid keys are 22023; registrations of
-- backends that are gone are dropped by the next listen; read-only is 25006.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT lease.listen('ls-1');
SELECT lease.listen('ls-1');   -- idempotent
SELECT lease.listen('*');
SELECT key, pid = pg_backend_pid() AS mine FROM lease.listeners ORDER BY key;
SELECT lease.unlisten('ls-1') AS dropped;
SELECT lease.unlisten('ls-1') AS dropped;
SELECT lease.unlisten('*') AS dropped;
SELECT count(*) AS registrations FROM lease.listeners;

-- invalid keys, like everywhere
SELECT lease.listen(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.listen('');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.listen(E'ls\n1');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.unlisten(repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE

-- a registration of a backend that is gone (pid 0 never exists) is dropped by
-- the next listen
INSERT INTO lease.listeners VALUES (0, 'ls-gone', clock_timestamp());
SELECT lease.listen('ls-2');
SELECT key FROM lease.listeners ORDER BY key;
SELECT lease.unlisten('*') AS dropped;

-- read-only
BEGIN READ ONLY;
SELECT lease.listen('ls-3');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- other roles may listen (EXECUTE for PUBLIC) but not read the registry
CREATE ROLE regress_pglease_listener;
SET SESSION AUTHORIZATION regress_pglease_listener;
SELECT lease.listen('ls-4');
SELECT lease.unlisten('ls-4') AS dropped;
SELECT * FROM lease.listeners;
\echo :LAST_ERROR_SQLSTATE
RESET SESSION AUTHORIZATION;
DROP ROLE regress_pglease_listener;

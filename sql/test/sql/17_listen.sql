-- 17_listen: lease.listen / lease.unlisten register and drop this backend's
-- interest in a key ('*': every key), for pg_lease.notify = 'waiters'.
-- listen answers true once its registration was committed before the call.
-- Invalid keys are 22023; registrations of backends that are gone are dropped
-- by later listens, at most 100 per call; a session holds at most 1000
-- registrations (54000 beyond); read-only is 25006.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT lease.listen('ls-1');
SELECT lease.listen('ls-1');   -- idempotent; committed before: true
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

-- Within one transaction a new registration is not yet committed: false,
-- however often listen is called; after the commit, true.
BEGIN;
SELECT lease.listen('ls-5') AS settled;
SELECT lease.listen('ls-5') AS settled;
COMMIT;
SELECT lease.listen('ls-5') AS settled;
SELECT lease.unlisten('*') AS dropped;

-- Clean-up is bounded: 250 registrations of a backend that is gone (pid 0)
-- take three listens to drop, 100 at most per call.
INSERT INTO lease.listeners SELECT 0, 'ls-gone-' || i, clock_timestamp() FROM generate_series(1, 250) i;
SELECT lease.listen('ls-6') IS NOT NULL AS listened;
SELECT count(*) AS gone_left FROM lease.listeners WHERE pid = 0;
SELECT lease.listen('ls-6') IS NOT NULL AS listened;
SELECT count(*) AS gone_left FROM lease.listeners WHERE pid = 0;
SELECT lease.listen('ls-6') IS NOT NULL AS listened;
SELECT count(*) AS gone_left FROM lease.listeners WHERE pid = 0;
SELECT lease.unlisten('*') AS dropped;

-- At most 1000 registrations of keys per session: the 1001st key is refused
-- with 54000 and nothing is added; a key already registered is answered as
-- usual, and '*' (every key) is taken beside the 1000 and does not count.
SELECT count(lease.listen('ls-cap-' || i)) AS registered FROM generate_series(1, 1000) i;
SELECT lease.listen('ls-cap-1001');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.listen('ls-cap-1') AS settled;
SELECT count(*) AS registrations FROM lease.listeners WHERE pid = pg_backend_pid();
SELECT lease.listen('*') AS settled;
SELECT lease.listen('*') AS settled;
SELECT count(*) AS registrations FROM lease.listeners WHERE pid = pg_backend_pid();
-- With '*' registered a further key is covered: no row, no 54000.
SELECT lease.listen('ls-cap-1002') AS settled;
SELECT count(*) AS registrations FROM lease.listeners WHERE pid = pg_backend_pid();
SELECT lease.unlisten('ls-cap-1') AS dropped;
SELECT lease.listen('ls-cap-1001') AS settled;
SELECT lease.unlisten('*') AS dropped;

-- listen leaves no row behind for a key never leased.
SELECT lease.listen('ls-never') AS settled;
SELECT count(*) AS rows FROM lease.leases WHERE key = 'ls-never';
SELECT lease.unlisten('*') AS dropped;

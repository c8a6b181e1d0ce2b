-- 12_versions: what differs between PostgreSQL majors.
--
-- From PostgreSQL 17 an interval can be infinite ('infinity', '-infinity',
-- and timestamptz 'infinity' - now() is one). pg_lease refuses an infinite
-- ttl, wait or free_for with invalid_input (22023) 'must be finite', like any
-- other invalid duration, and changes nothing. Up to 16 the literal is a
-- syntax error (22007) and subtracting an infinite timestamp is an error
-- (22008), so no infinite interval can reach the functions.
--
-- Two expected outputs: 12_versions.out (17 and later) and 12_versions_1.out
-- (14 to 16). The first query pins which one a server must match.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT current_setting('server_version_num')::int >= 170000 AS has_infinite_intervals;

-- A fresh install (earlier files leave an epoch floor), so the first grant is 1.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;

SELECT acquired, epoch FROM lease.acquire('ver-1', 'o1', interval '30s');
CREATE TABLE ver_before AS SELECT * FROM lease.leases;

-- acquire: ttl, wait, both (every violation named), either sign, computed.
SELECT * FROM lease.acquire('ver-2', 'o1', interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-2', 'o1', interval '-infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-2', 'o1', interval '30s', interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-2', 'o1', interval '30s', wait => interval '-infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-2', 'o1', interval 'infinity', interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('', 'o1', interval '-infinity', interval '-1s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-2', 'o1', timestamptz 'infinity' - now());
\echo :LAST_ERROR_SQLSTATE
-- Held by the caller (idempotent acquire) or by another owner: still refused,
-- validation comes before state.
SELECT * FROM lease.acquire('ver-1', 'o1', interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('ver-1', 'o2', interval '1s', interval 'infinity');
\echo :LAST_ERROR_SQLSTATE

-- renew of a held grant with an infinite ttl.
SELECT * FROM lease.renew('ver-1', 'o1', 1, interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('ver-1', 'o1', 1, interval '-infinity');
\echo :LAST_ERROR_SQLSTATE

-- cleanup (operators: this is the superuser) with an infinite free_for.
SELECT * FROM lease.cleanup(interval 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.cleanup(interval '-infinity', 0);
\echo :LAST_ERROR_SQLSTATE

-- Nothing changed: the grant is as it was, no other key, floor 0.
SELECT count(*) AS changed_rows FROM (
  (SELECT * FROM lease.leases EXCEPT SELECT * FROM ver_before)
  UNION ALL
  (SELECT * FROM ver_before EXCEPT SELECT * FROM lease.leases)) d;
SELECT count(*) AS ver_2_rows FROM lease.leases WHERE key = 'ver-2';
SELECT * FROM lease.epoch_floor;
SELECT status FROM lease.release('ver-1', 'o1', 1);
DROP TABLE ver_before;

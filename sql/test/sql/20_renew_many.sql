-- 20_renew_many (0.4.0): lease.renew_many renews many grants of one owner in
-- one statement. Each key gets renew's answer (status, precedence, role
-- binding); the ok ones get one common expiry; rows come back in input order;
-- durability is forced only when something was renewed; bad input is 22023
-- with every violation named and changes nothing.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;

-- three held keys of one owner, one of another owner, one free, one lapsed
SELECT acquired, epoch FROM lease.acquire('rm-c', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('rm-a', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('rm-b', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('rm-other', 'o2', interval '30s');
SELECT acquired, epoch FROM lease.acquire('rm-free', 'o1', interval '30s');
SELECT status FROM lease.release('rm-free', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('rm-lapsed', 'o1', interval '0.2s');
SELECT acquired, epoch FROM lease.acquire('rm-taken', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('rm-taken', 'o2', interval '30s');

-- all ok: input order kept, one expiry for all, epochs unchanged
SELECT key, status, expires_at > clock_timestamp() + interval '50s' AS renewed
  FROM lease.renew_many('{rm-c,rm-a,rm-b}', 'o1', '{1,1,1}', interval '60s');
SELECT count(DISTINCT expires_at) AS one_expiry
  FROM lease.renew_many('{rm-c,rm-a,rm-b}', 'o1', '{1,1,1}', interval '60s');
SELECT key, epoch, expires_at > clock_timestamp() + interval '50s' AS renewed
  FROM lease.leases WHERE key IN ('rm-a', 'rm-b', 'rm-c') ORDER BY key;

-- a shorter ttl shortens every grant, as renew does
SELECT key, status, expires_at < clock_timestamp() + interval '20s' AS shortened
  FROM lease.renew_many('{rm-a,rm-b}', 'o1', '{1,1}', interval '15s');

-- every status beside ok ones: the failures change nothing, the ok keys are
-- renewed. never leased and free: not_owner; another owner's: not_owner;
-- own expired grant: lapsed; own grant taken over after its lapse: lapsed;
-- wrong epoch: epoch_mismatch; precedence as renew (not_owner > lapsed >
-- epoch_mismatch: the taken-over grant presented with another epoch).
CREATE FUNCTION pg_temp.failures() RETURNS text LANGUAGE sql
AS $$ SELECT md5(string_agg(l::text, ',' ORDER BY l.key)) FROM lease.leases l
       WHERE l.key LIKE 'rm-%' AND l.key NOT IN ('rm-a', 'rm-b') $$;
SELECT pg_temp.failures() AS s0 \gset
SELECT key, status, expires_at IS NOT NULL AS has_expiry
  FROM lease.renew_many('{rm-a,rm-never,rm-free,rm-other,rm-lapsed,rm-taken,rm-c,rm-b}', 'o1',
                        '{1,1,1,1,1,1,2,1}', interval '40s');
SELECT key, owner, epoch, expires_at > clock_timestamp() + interval '35s' AS renewed_40s
  FROM lease.leases WHERE key LIKE 'rm-%' ORDER BY key;
SELECT status FROM lease.renew_many('{rm-taken}', 'o1', '{7}', interval '40s');
SELECT status FROM lease.renew_many('{rm-lapsed}', 'o1', '{7}', interval '40s');
-- the answers equal renew's, key by key
SELECT m.key, m.status = r.status AS same
  FROM lease.renew_many('{rm-never,rm-free,rm-other,rm-lapsed,rm-taken}', 'o1', '{1,1,1,1,1}', interval '40s') m,
       LATERAL lease.renew(m.key, 'o1', 1, interval '40s') r;
SELECT pg_temp.failures() = :'s0' AS failures_unchanged;

-- durability: forced when a key was renewed, left alone when none was
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT count(*) FROM lease.renew_many('{rm-a,rm-never}', 'o1', '{1,1}', interval '40s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT count(*) FROM lease.renew_many('{rm-never,rm-other}', 'o1', '{1,1}', interval '40s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT key, status FROM lease.renew_many('{rm-never}', 'o1', '{1}', interval '40s');
SELECT current_setting('synchronous_commit');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = local;
SELECT count(*) FROM lease.renew_many('{rm-a}', 'o1', '{1}', interval '40s');
SELECT current_setting('synchronous_commit');
COMMIT;

-- an empty batch answers nothing and changes nothing
SELECT count(*) FROM lease.renew_many('{}', 'o1', '{}', interval '40s');

-- roles: another role presenting the owner string and the epoch is told
-- not_owner for that key; a member of the holder's role renews it.
CREATE ROLE regress_pglease_rm_alice;
CREATE ROLE regress_pglease_rm_mallory;
CREATE ROLE regress_pglease_rm_bob IN ROLE regress_pglease_rm_alice;
SET SESSION AUTHORIZATION regress_pglease_rm_alice;
SELECT acquired, epoch FROM lease.acquire('rm-role', 'o1', interval '30s');
RESET SESSION AUTHORIZATION;
SELECT pg_temp.state() AS s1 \gset
SET SESSION AUTHORIZATION regress_pglease_rm_mallory;
SELECT key, status FROM lease.renew_many('{rm-role}', 'o1', '{1}', interval '40s');
RESET SESSION AUTHORIZATION;
SELECT pg_temp.state() = :'s1' AS unchanged;
SET SESSION AUTHORIZATION regress_pglease_rm_bob;
SELECT key, status FROM lease.renew_many('{rm-role}', 'o1', '{1}', interval '40s');
RESET SESSION AUTHORIZATION;
-- the superuser presents the role's grant as its own: allowed (membership)
SELECT key, status FROM lease.renew_many('{rm-role,rm-a}', 'o1', '{1,1}', interval '40s');
DROP ROLE regress_pglease_rm_bob;
DROP ROLE regress_pglease_rm_mallory;
DELETE FROM lease.leases WHERE key = 'rm-role';
DROP ROLE regress_pglease_rm_alice;

-- bad input: 22023 naming every violation, nothing changed
SELECT pg_temp.state() AS s2 \gset
SELECT * FROM lease.renew_many(NULL, 'o1', '{1}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a}', 'o1', NULL, interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a,rm-b}', 'o1', '{1}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a,NULL,""}', 'o1', '{1,1,1}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a,rm-b,rm-a,rm-a}', 'o1', '{1,1,1,1}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a,rm-b,rm-c}', 'o1', '{1,NULL,0}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{{rm-a},{rm-b}}', 'o1', '{{1},{1}}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many(ARRAY['rm-a', E'rm-\n', repeat('k', 1025)], '', '{1,1,-1}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew_many('{rm-a}', 'o1', '{1}', interval '0');
\echo :LAST_ERROR_SQLSTATE
-- more than ten element violations: the first ten, then a count
SELECT * FROM lease.renew_many(array_fill(''::text, ARRAY[12]), 'o1', array_fill(0::bigint, ARRAY[12]), interval '40s');
\echo :LAST_ERROR_SQLSTATE
-- the bound on a batch: 1000 keys pass validation, 1001 do not
SELECT count(*) FROM lease.renew_many(ARRAY(SELECT 'rm-n' || i FROM generate_series(1, 1000) i), 'o1',
                                      array_fill(1::bigint, ARRAY[1000]), interval '40s');
SELECT * FROM lease.renew_many(ARRAY(SELECT 'rm-n' || i FROM generate_series(1, 1001) i), 'o1',
                               array_fill(1::bigint, ARRAY[1001]), interval '40s');
\echo :LAST_ERROR_SQLSTATE
-- ttl above max_ttl, as renew
SELECT * FROM lease.renew_many('{rm-a}', 'o1', '{1}', interval '2 hours');
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.state() = :'s2' AS unchanged;

-- read-only transactions cannot renew
BEGIN READ ONLY;
SELECT * FROM lease.renew_many('{rm-a}', 'o1', '{1}', interval '40s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- a schema with its own clock_timestamp() first in search_path changes nothing
CREATE SCHEMA regress_pglease_rm_fake;
CREATE FUNCTION regress_pglease_rm_fake.clock_timestamp() RETURNS timestamptz LANGUAGE sql
AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$;
SET search_path = regress_pglease_rm_fake, pg_catalog, public;
SELECT key, status, expires_at > pg_catalog.clock_timestamp() + interval '30s' AS real_clock
  FROM lease.renew_many('{rm-a}', 'o1', '{1}', interval '40s');
RESET search_path;
DROP SCHEMA regress_pglease_rm_fake CASCADE;

DELETE FROM lease.leases WHERE key LIKE 'rm-%';

-- 70_acquire_release_many (0.5.0): lease.acquire_many and lease.release_many
-- run lease.acquire (wait 0) and lease.release for many keys of one owner in
-- one statement, in byte order of the keys; rows come back in input order,
-- each as the per-key call answers it (epochs, statuses, role binding, the
-- handover of a release); bad input is 22023 naming every violation and
-- changes nothing; read-only transactions are refused.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;

-- acquire_many: never leased (epoch 1), free (counter + 1), the caller's own
-- grant (same epoch and expiry), another owner's (denied), lapsed (taken
-- over, epoch + 1); rows in input order
SELECT acquired, epoch FROM lease.acquire('am-own', 'o1', interval '30s');
SELECT expires_at AS own_exp FROM lease.inspect('am-own') \gset
SELECT acquired, epoch FROM lease.acquire('am-free', 'o2', interval '30s');
SELECT status FROM lease.release('am-free', 'o2', 1);
SELECT acquired, epoch FROM lease.acquire('am-other', 'o2', interval '30s');
SELECT acquired, epoch FROM lease.acquire('am-lapsed', 'o2', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT key, acquired, epoch, expires_at > clock_timestamp() + interval '50s' AS for_60s
  FROM lease.acquire_many('{am-new,am-own,am-other,am-free,am-lapsed}', 'o1', interval '60s');
SELECT expires_at = :'own_exp' AS own_expiry_kept FROM lease.inspect('am-own');
SELECT key, owner, epoch FROM lease.leases WHERE key LIKE 'am-%' ORDER BY key;
-- the answers equal acquire's, key by key (every one is now idempotent or denied)
SELECT m.key, (m.acquired, m.epoch, m.expires_at) IS NOT DISTINCT FROM (a.acquired, a.epoch, a.expires_at) AS same
  FROM lease.acquire_many('{am-own,am-other,am-new}', 'o1', interval '60s') m,
       LATERAL lease.acquire(m.key, 'o1', interval '60s') a;
-- an empty batch answers nothing
SELECT count(*) FROM lease.acquire_many('{}', 'o1', interval '60s');

-- release_many: ok keys freed (counter epoch + 1), every status of release
-- beside them (never leased, another owner's, wrong epoch, own lapsed grant),
-- failures unchanged; rows in input order
SELECT acquired, epoch FROM lease.acquire('rl-lapsed', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
CREATE FUNCTION pg_temp.failures() RETURNS text LANGUAGE sql
AS $$ SELECT md5(string_agg(l::text, ',' ORDER BY l.key)) FROM lease.leases l
       WHERE l.key IN ('am-other', 'am-new', 'rl-lapsed') $$;
SELECT pg_temp.failures() AS f0 \gset
SELECT key, status
  FROM lease.release_many('{am-own,rl-never,am-other,am-free,am-new,rl-lapsed,am-lapsed}', 'o1', '{1,1,1,2,9,1,2}');
SELECT key, owner, epoch, held FROM lease.list('{am-own,am-free,am-lapsed,am-new,am-other}');
SELECT pg_temp.failures() = :'f0' AS failures_unchanged;
-- the answers equal release's
SELECT m.key, m.status = r.status AS same
  FROM lease.release_many('{am-own,am-other,am-new}', 'o1', '{1,1,9}') m,
       LATERAL lease.release(m.key, 'o1', CASE m.key WHEN 'am-new' THEN 9 ELSE 1 END) r;
SELECT count(*) FROM lease.release_many('{}', 'o1', '{}');

-- a release in the batch hands its key to a ready candidate under the
-- releasing role's strategy, in the same transaction: never free; the
-- others are freed
SELECT previous FROM lease.set_strategy('rl-ho-1', 'priority');
SELECT previous FROM lease.set_strategy('rl-ho-2', 'priority');
SELECT key, acquired, epoch FROM lease.acquire_many('{rl-ho-2,rl-ho-1,rl-ho-3}', 'leaver', interval '30s');
SELECT status FROM lease.candidate('rl-ho-1', 'heir-1', interval '30s', priority => 2);
SELECT status FROM lease.candidate('rl-ho-2', 'heir-2', interval '30s', priority => 1);
SELECT key, status FROM lease.release_many('{rl-ho-1,rl-ho-2,rl-ho-3}', 'leaver', '{1,1,1}');
SELECT key, held, owner, epoch FROM lease.list('{rl-ho-1,rl-ho-2,rl-ho-3}');
SELECT event, owner, epoch, previous_owner, previous_epoch FROM lease.history('rl-ho-1', 1);
SELECT event, owner, epoch, previous_owner, previous_epoch FROM lease.history('rl-ho-2', 1);
-- the heir takes up the handed grant with acquire_many (idempotent)
SELECT key, acquired, epoch FROM lease.acquire_many('{rl-ho-1}', 'heir-1', interval '30s');

-- roles: another role presenting the holder's owner string and epochs is
-- denied (acquire) and told not_owner (release), nothing changes; a member
-- of the holder's role releases them
CREATE ROLE regress_pglease_am_alice;
CREATE ROLE regress_pglease_am_mallory;
CREATE ROLE regress_pglease_am_bob IN ROLE regress_pglease_am_alice;
SET SESSION AUTHORIZATION regress_pglease_am_alice;
SELECT key, acquired, epoch FROM lease.acquire_many('{am-role-b,am-role-a}', 'o1', interval '30s');
RESET SESSION AUTHORIZATION;
SELECT pg_temp.state() AS s1 \gset
SET SESSION AUTHORIZATION regress_pglease_am_mallory;
SELECT key, acquired, epoch FROM lease.acquire_many('{am-role-a,am-role-b}', 'o1', interval '30s');
SELECT key, status FROM lease.release_many('{am-role-a,am-role-b}', 'o1', '{1,1}');
RESET SESSION AUTHORIZATION;
SELECT pg_temp.state() = :'s1' AS unchanged;
SET SESSION AUTHORIZATION regress_pglease_am_bob;
SELECT key, status FROM lease.release_many('{am-role-a,am-role-b}', 'o1', '{1,1}');
RESET SESSION AUTHORIZATION;
SELECT key, held, epoch FROM lease.list('{am-role-a,am-role-b}');
DELETE FROM lease.leases WHERE key LIKE 'am-role-%';
DROP ROLE regress_pglease_am_bob;
DROP ROLE regress_pglease_am_mallory;
DROP ROLE regress_pglease_am_alice;

-- bad input: 22023 naming every violation, nothing changed
SELECT pg_temp.state() AS s2 \gset
SELECT * FROM lease.acquire_many(NULL, 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire_many('{{am-a},{am-b}}', 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire_many(ARRAY['am-a', NULL, '', E'am-\n', repeat('k', 1025), 'am-a'], '', interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire_many('{am-a}', 'o1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire_many(array_fill(''::text, ARRAY[12]), 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire_many(ARRAY(SELECT 'am-n' || i FROM generate_series(1, 1001) i), 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
-- ttl above max_ttl: acquire's own check
SELECT * FROM lease.acquire_many('{am-a}', 'o1', interval '2 hours');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many(NULL, 'o1', '{1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many('{am-a}', 'o1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many('{am-a,am-b}', NULL, '{1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many('{am-a,am-b,am-a}', 'o1', '{1,NULL,0}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many('{am-a}', 'o1', '{{1}}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release_many(ARRAY(SELECT 'am-n' || i FROM generate_series(1, 1001) i), 'o1',
                                 array_fill(1::bigint, ARRAY[1001]));
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.state() = :'s2' AS unchanged;
-- 1000 keys pass: all granted, all released
SELECT count(*) FILTER (WHERE acquired AND epoch = 1) AS granted
  FROM lease.acquire_many(ARRAY(SELECT 'am-n' || i FROM generate_series(1, 1000) i), 'o1', interval '30s');
SELECT count(*) FILTER (WHERE status = 'ok') AS released
  FROM lease.release_many(ARRAY(SELECT 'am-n' || i FROM generate_series(1, 1000) i), 'o1',
                          array_fill(1::bigint, ARRAY[1000]));
DELETE FROM lease.leases WHERE key LIKE 'am-n%';

-- read-only transactions cannot acquire or release
BEGIN READ ONLY;
SELECT * FROM lease.acquire_many('{am-a}', 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM lease.release_many('{am-a}', 'o1', '{1}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- EXECUTE: every role on both; the helpers they use on none
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
   AND p.proname IN ('acquire_many', 'release_many', '_batch_violations', '_keys_violation')
 ORDER BY p.proname;

DELETE FROM lease.leases WHERE key LIKE 'am-%' OR key LIKE 'rl-%';

-- 21_key_state (0.4.0): inspect and list say why a key is not held. state is
-- held, lapsed (the grant expired without a release) or released (by its
-- holder or force_release); last_owner names the holder of a held or lapsed
-- grant; since is when the state began. list takes keys. Every role sees the
-- same answer, and reading changes nothing.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;

-- Bounds on the server's clock around each change, never a guess of elapsed time.
SELECT clock_timestamp() AS t0 \gset
SELECT acquired, epoch FROM lease.acquire('ks-held', 'o-held', interval '30s');
SELECT acquired, epoch FROM lease.acquire('ks-released', 'o-rel', interval '30s');
SELECT clock_timestamp() AS t1 \gset
SELECT status FROM lease.release('ks-released', 'o-rel', 1);
SELECT clock_timestamp() AS t2 \gset
SELECT acquired, epoch FROM lease.acquire('ks-forced', 'o-forced', interval '30s');
SELECT released, previous_owner, epoch FROM lease.force_release('ks-forced');
SELECT clock_timestamp() AS t3 \gset
SELECT acquired, epoch FROM lease.acquire('ks-lapsed', 'o-lapsed', interval '0.2s');
SELECT acquired, epoch FROM lease.acquire('ks-taken', 'o-old', interval '0.2s');
DO $$ DECLARE d timestamptz := clock_timestamp() + interval '60 s'; BEGIN
  WHILE ((SELECT held FROM lease.inspect('ks-lapsed')) OR (SELECT held FROM lease.inspect('ks-taken')))
        AND clock_timestamp() < d LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT acquired, epoch FROM lease.acquire('ks-taken', 'o-new', interval '30s');

-- inspect: held names its holder and the grant's start; lapsed keeps the
-- holder and says when it lapsed; released names nobody.
SELECT held, owner, epoch, state, last_owner,
       since BETWEEN :'t0' AND :'t1' AS since_grant,
       since = (SELECT acquired_at FROM lease.list(ARRAY['ks-held'])) AS since_is_acquired_at
  FROM lease.inspect('ks-held');
SELECT held, owner, epoch, expires_at, state, last_owner,
       since = (SELECT l.expires_at FROM lease.leases l WHERE l.key = 'ks-lapsed') AS since_expiry,
       since <= clock_timestamp() AS since_past
  FROM lease.inspect('ks-lapsed');
SELECT held, owner, epoch, expires_at, state, last_owner,
       since BETWEEN :'t1' AND :'t2' AS since_release
  FROM lease.inspect('ks-released');
SELECT held, owner, epoch, state, last_owner,
       since BETWEEN :'t2' AND :'t3' AS since_forced_release
  FROM lease.inspect('ks-forced');
SELECT held, owner, epoch, state, last_owner FROM lease.inspect('ks-taken');
SELECT count(*) AS rows_for_never FROM lease.inspect('ks-never');

-- A held grant reports lapsed, with its holder, once its expiry passes.
SELECT acquired, epoch FROM lease.acquire('ks-soon', 'o-soon', interval '0.2s');
SELECT held, state, last_owner FROM lease.inspect('ks-soon');
DO $$ DECLARE d timestamptz := clock_timestamp() + interval '60 s'; BEGIN
  WHILE (SELECT held FROM lease.inspect('ks-soon')) AND clock_timestamp() < d LOOP PERFORM pg_sleep(0.05); END LOOP;
END $$;
SELECT held, owner, state, last_owner FROM lease.inspect('ks-soon');

-- list: the same report for every key, and for named keys only.
SELECT key, held, owner, epoch, state, last_owner FROM lease.list() WHERE key LIKE 'ks-%';
SELECT key, state, last_owner
  FROM lease.list(ARRAY['ks-taken', 'ks-never', 'ks-lapsed', 'ks-taken', 'ks-held']);
SELECT count(*) AS rows_for_no_keys FROM lease.list('{}');
SELECT count(*) = (SELECT count(*) FROM lease.leases) AS null_means_every_key FROM lease.list(NULL);
SELECT l.key FROM lease.list() l, lease.inspect(l.key) i
 WHERE (l.held, l.owner, l.epoch, l.expires_at, l.state, l.last_owner, l.since)
       IS DISTINCT FROM (i.held, i.owner, i.epoch, i.expires_at, i.state, i.last_owner, i.since);
SELECT l.key FROM lease.list() l
  LEFT JOIN lease.list(ARRAY(SELECT key FROM lease.leases)) k ON k.key = l.key
 WHERE (l.held, l.owner, l.epoch, l.acquired_at, l.expires_at, l.state, l.last_owner, l.since)
       IS DISTINCT FROM (k.held, k.owner, k.epoch, k.acquired_at, k.expires_at, k.state, k.last_owner, k.since);

-- Another role sees what the installer sees: the holder of a lapsed grant
-- was shown to it in owner while held. No role column appears.
CREATE ROLE regress_pglease_viewer;
SET SESSION AUTHORIZATION regress_pglease_viewer;
SELECT key, held, owner, epoch, state, last_owner FROM lease.list(ARRAY['ks-lapsed', 'ks-released', 'ks-held']);
SELECT state, last_owner FROM lease.inspect('ks-lapsed');
RESET SESSION AUTHORIZATION;
DROP ROLE regress_pglease_viewer;

-- Bad keys: invalid_input naming each position, nothing changed.
SELECT pg_temp.state() AS s0 \gset
SELECT * FROM lease.list(ARRAY['ks-held', NULL, '', repeat('k', 1025), E'a\tb']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.list(ARRAY[['ks-held'], ['ks-lapsed']]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.list(array_fill(''::text, ARRAY[12]));
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.state() = :'s0' AS unchanged;

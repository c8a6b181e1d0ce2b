-- 31_hostile_history (0.5.0): history and health show a grant's role, and
-- the role that made an event, only to that role and its members (NULL to
-- every other role, as inspect and list show no role); retention counts
-- each key's events per role that made them (actor), so one role's calls
-- never remove another role's events, and storage is bounded by keep_rows
-- per key and role.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE ROLE regress_pglease_hy_alice;
CREATE ROLE regress_pglease_hy_eve;
CREATE ROLE regress_pglease_hy_member;
GRANT regress_pglease_hy_alice TO regress_pglease_hy_member;

-- alice's events of hy-key: a grant and a release; then she holds hy-held.
SET SESSION AUTHORIZATION regress_pglease_hy_alice;
SELECT acquired, epoch FROM lease.acquire('hy-key', 'alice', interval '30s');
SELECT status FROM lease.release('hy-key', 'alice', 1);
SELECT acquired, epoch FROM lease.acquire('hy-held', 'alice', interval '30s');

-- 1. Roles are shown to their members only.
SET SESSION AUTHORIZATION regress_pglease_hy_eve;
SELECT seq, event, owner, holder_role, actor FROM lease.history('hy-key');
SELECT key, held, owner, holder_role FROM lease.health() WHERE key LIKE 'hy-%' ORDER BY key;
SET SESSION AUTHORIZATION regress_pglease_hy_member;
SELECT seq, event, owner, holder_role, actor FROM lease.history('hy-key');
SELECT key, held, owner, holder_role FROM lease.health() WHERE key LIKE 'hy-%' ORDER BY key;
SET SESSION AUTHORIZATION regress_pglease_hy_alice;
SELECT key, held, owner, holder_role FROM lease.health() WHERE key LIKE 'hy-%' ORDER BY key;

-- 2. eve makes 51 grant and release cycles of the free key (102 events):
-- her own oldest two are trimmed, alice's two stay.
SET SESSION AUTHORIZATION regress_pglease_hy_eve;
DO $$
DECLARE
  e bigint;
BEGIN
  FOR i IN 1 .. 51 LOOP
    SELECT a.epoch INTO e FROM lease.acquire('hy-key', 'eve', interval '30s') a;
    PERFORM lease.release('hy-key', 'eve', e);
  END LOOP;
END
$$;
-- eve sees her own role, not alice's
SELECT seq, event, owner, holder_role IS NOT NULL AS role_shown, actor IS NOT NULL AS actor_shown
  FROM lease.history('hy-key', 10000) WHERE seq <= 4 OR seq >= 103 ORDER BY seq;
SET SESSION AUTHORIZATION regress_pglease_hy_alice;
SELECT seq, event, owner, epoch, holder_role, actor
  FROM lease.history('hy-key', 10000) WHERE actor = session_user;
RESET SESSION AUTHORIZATION;
SELECT actor, count(*), min(seq), max(seq), min(actor_seq), max(actor_seq)
  FROM lease.history WHERE key = 'hy-key' GROUP BY actor ORDER BY actor;
-- health: the grants counter goes on; the history is complete since the
-- newest event trimmed (eve's second), later than alice's events
SELECT h.grants, h.transitions,
       h.history_since = (SELECT x.at FROM lease.history x WHERE x.key = 'hy-key' ORDER BY x.seq LIMIT 1)
         AS oldest_kept,
       h.history_since > (SELECT max(x.at) FROM lease.history x
                           WHERE x.key = 'hy-key' AND x.actor = 'regress_pglease_hy_alice') AS after_alice
  FROM lease.health() h WHERE h.key = 'hy-key';

-- 3. configure_history lowers the retention of every key and role at once:
-- 3 events of each role; alice keeps her 2, eve her last 3, and the key's
-- newest row records the newest event trimmed.
SELECT x.at::text AS cut FROM lease.history x WHERE x.key = 'hy-key' AND x.seq = 101 \gset
SELECT * FROM lease.configure_history(3);
SELECT seq, event, owner, actor, actor_seq, trimmed_at = :'cut'::timestamptz AS records_the_trim
  FROM lease.history WHERE key = 'hy-key' ORDER BY seq;
SELECT h.history_since = :'cut'::timestamptz AS newest_trimmed
  FROM lease.health() h WHERE h.key = 'hy-key';
-- a later write trims only its own role's events of the key
SET SESSION AUTHORIZATION regress_pglease_hy_alice;
SELECT acquired, epoch FROM lease.acquire('hy-key', 'alice', interval '30s');
SELECT status FROM lease.release('hy-key', 'alice', 105);
RESET SESSION AUTHORIZATION;
SELECT seq, event, owner, actor, actor_seq, trimmed_at = :'cut'::timestamptz AS trimmed_before
  FROM lease.history WHERE key = 'hy-key' ORDER BY seq;
SELECT * FROM lease.configure_history(100);

DELETE FROM lease.leases WHERE key LIKE 'hy-%';
DELETE FROM lease.history WHERE key LIKE 'hy-%';
DROP ROLE regress_pglease_hy_member;
DROP ROLE regress_pglease_hy_alice;
DROP ROLE regress_pglease_hy_eve;

-- 14_roles (0.3.0): a grant is bound to the database role that took it
-- (session_user at acquire). renew, release and fence work only for a member
-- of that role; any other role, even one presenting the holder's owner string
-- and epoch (which inspect and list show to everyone), is told not_owner and
-- changes nothing; its acquire with the holder's owner string is "held by
-- another". Operators' functions stay closed. Roles are switched with SET
-- SESSION AUTHORIZATION (which sets session_user); all are dropped at the end.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;

CREATE ROLE regress_pglease_alice;
CREATE ROLE regress_pglease_mallory;
CREATE ROLE regress_pglease_team;
CREATE ROLE regress_pglease_bob IN ROLE regress_pglease_team;
CREATE ROLE regress_pglease_gone;
-- a member of team that does not inherit its privileges: still a member
CREATE ROLE regress_pglease_noinh NOINHERIT IN ROLE regress_pglease_team;

-- alice takes a key; the grant records her role.
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT acquired, epoch FROM lease.acquire('role-1', 'worker-a', interval '30s');
RESET SESSION AUTHORIZATION;
SELECT key, owner, epoch, holder_role FROM lease.leases WHERE key = 'role-1';
SELECT pg_temp.state() AS s0 \gset

-- mallory sees the owner string and the epoch ...
SET SESSION AUTHORIZATION regress_pglease_mallory;
SELECT held, owner, epoch FROM lease.inspect('role-1');
SELECT key, held, owner, epoch FROM lease.list() WHERE key = 'role-1';
-- ... and presents them: every call is refused, nothing changes.
SELECT status, expires_at FROM lease.renew('role-1', 'worker-a', 1, interval '30s');
SELECT status FROM lease.release('role-1', 'worker-a', 1);
SELECT lease.fence('role-1', 'worker-a', 1);
\echo :LAST_ERROR_SQLSTATE
-- the idempotent re-acquire of the owner string is not hers: held by another
SELECT acquired, epoch, expires_at FROM lease.acquire('role-1', 'worker-a', interval '30s');
SELECT * FROM lease.acquire('role-1', 'worker-a', interval '30s', wait => interval '0.2s');
\echo :LAST_ERROR_SQLSTATE
-- operators' functions and the tables are closed to her
SELECT * FROM lease.force_release('role-1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.cleanup(interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure(max_ttl => interval '1 year');
\echo :LAST_ERROR_SQLSTATE
UPDATE lease.leases SET holder_role = 'regress_pglease_mallory';
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.settings;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.timeline_state;
\echo :LAST_ERROR_SQLSTATE
-- SET ROLE to the holder's role needs membership she does not have
SET ROLE regress_pglease_alice;
\echo :LAST_ERROR_SQLSTATE
RESET SESSION AUTHORIZATION;
SELECT pg_temp.state() = :'s0' AS unchanged;

-- alice, with the same owner string and epoch, still holds it all.
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT acquired, epoch FROM lease.acquire('role-1', 'worker-a', interval '30s');
SELECT status FROM lease.renew('role-1', 'worker-a', 1, interval '30s');
SELECT lease.fence('role-1', 'worker-a', 1) > clock_timestamp() AS fenced;
SELECT status FROM lease.release('role-1', 'worker-a', 1);
RESET SESSION AUTHORIZATION;

-- A free or lapsed key is anyone's to take: mallory takes role-1 over (epoch
-- 3); now alice is the other role.
SET SESSION AUTHORIZATION regress_pglease_mallory;
SELECT acquired, epoch FROM lease.acquire('role-1', 'worker-a', interval '30s');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT status FROM lease.renew('role-1', 'worker-a', 3, interval '30s');
SELECT acquired FROM lease.acquire('role-1', 'worker-a', interval '30s');
RESET SESSION AUTHORIZATION;

-- Membership: a grant taken by role team can be renewed by bob (a member of
-- team); a grant bob takes is bound to bob, which team is not a member of.
SET SESSION AUTHORIZATION regress_pglease_team;
SELECT acquired, epoch FROM lease.acquire('role-team', 't', interval '30s');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_bob;
SELECT status FROM lease.renew('role-team', 't', 1, interval '30s');
SELECT lease.fence('role-team', 't', 1) > clock_timestamp() AS member_fenced;
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_team;
SELECT acquired, epoch FROM lease.acquire('role-team2', 't', interval '30s');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_bob;
SELECT status FROM lease.release('role-team2', 't', 1);  -- a member releases the role's grant
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_noinh;
SELECT status FROM lease.renew('role-team', 't', 1, interval '30s');  -- membership, not inheritance, decides
SELECT acquired, epoch FROM lease.acquire('role-team', 't', interval '30s');
SELECT acquired, epoch FROM lease.acquire('role-bob', 'b', interval '30s');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_team;
SELECT status FROM lease.renew('role-bob', 'b', 1, interval '30s');
SELECT status FROM lease.release('role-team', 't', 1);
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT status FROM lease.release('role-bob', 'b', 1);
RESET SESSION AUTHORIZATION;
-- A superuser is a member of every role: it may act on any grant.
SELECT status FROM lease.renew('role-bob', 'b', 1, interval '30s');

-- The role of a grant that was dropped: nobody but a superuser can act on
-- it; it lapses, or an operator force-releases it.
SET SESSION AUTHORIZATION regress_pglease_gone;
SELECT acquired, epoch FROM lease.acquire('role-gone', 'g', interval '30s');
RESET SESSION AUTHORIZATION;
DROP ROLE regress_pglease_gone;
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT status FROM lease.renew('role-gone', 'g', 1, interval '30s');
RESET SESSION AUTHORIZATION;
SELECT released, previous_owner, epoch FROM lease.force_release('role-gone');

-- A grant from before 0.3.0 (holder_role NULL) is bound to no role: any role
-- renews or releases it, as in 0.2.0 (simulated: the owner clears the column).
SET SESSION AUTHORIZATION regress_pglease_alice;
SELECT acquired, epoch FROM lease.acquire('role-old', 'o', interval '30s');
RESET SESSION AUTHORIZATION;
UPDATE lease.leases SET holder_role = NULL WHERE key = 'role-old';
SET SESSION AUTHORIZATION regress_pglease_mallory;
SELECT status FROM lease.renew('role-old', 'o', 1, interval '30s');
SELECT status FROM lease.release('role-old', 'o', 1);
RESET SESSION AUTHORIZATION;

-- An operator role gets force_release and cleanup by an explicit GRANT.
CREATE ROLE regress_pglease_ops;
GRANT EXECUTE ON FUNCTION lease.force_release(text) TO regress_pglease_ops;
SET SESSION AUTHORIZATION regress_pglease_ops;
SELECT released, previous_owner, epoch FROM lease.force_release('role-1');
RESET SESSION AUTHORIZATION;
REVOKE EXECUTE ON FUNCTION lease.force_release(text) FROM regress_pglease_ops;

DELETE FROM lease.leases WHERE key LIKE 'role-%';
DROP ROLE regress_pglease_alice, regress_pglease_mallory, regress_pglease_bob,
          regress_pglease_noinh, regress_pglease_team, regress_pglease_ops;

-- 60_operator_handover (0.5.0): a release by a superuser, or by any role that
-- is a member of other roles without having been granted them (a superuser
-- is a member of every role), hands the key over only to candidates of its
-- own role and of the roles it was granted. An application that runs as a
-- superuser keeps its handovers from another role's candidate at a higher
-- priority, as any role does (30_hostile_handover).
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE ROLE regress_pglease_oh_admin SUPERUSER;
CREATE ROLE regress_pglease_oh_eve;
CREATE ROLE regress_pglease_oh_team;
GRANT regress_pglease_oh_team TO regress_pglease_oh_admin;

-- 1. The superuser's application holds oh-leader under its priority
-- strategy, its follower at priority 10. eve registers a candidate at the
-- highest priority: the release hands the key to the superuser's follower.
SET SESSION AUTHORIZATION regress_pglease_oh_admin;
SELECT previous FROM lease.set_strategy('oh-leader', 'priority');
SELECT acquired, epoch FROM lease.acquire('oh-leader', 'admin-1', interval '30s');
SELECT status FROM lease.candidate('oh-leader', 'admin-2', interval '30s', priority => 10);
SET SESSION AUTHORIZATION regress_pglease_oh_eve;
SELECT status FROM lease.candidate('oh-leader', 'eve-1', interval '30s', priority => 2147483647);
SET SESSION AUTHORIZATION regress_pglease_oh_admin;
-- its view ranks its own candidate only; eve's is listed, not choosable
SELECT owner, priority, live, rank FROM lease.candidates('oh-leader') ORDER BY owner;
SELECT status FROM lease.release('oh-leader', 'admin-1', 1);
SELECT held, owner, epoch FROM lease.inspect('oh-leader');
RESET SESSION AUTHORIZATION;
SELECT owner, holder_role FROM lease.leases WHERE key = 'oh-leader';

-- 2. With only eve's candidate left, the next release frees the key.
SET SESSION AUTHORIZATION regress_pglease_oh_admin;
SELECT status FROM lease.release('oh-leader', 'admin-2', 2);
SELECT held, owner, epoch FROM lease.inspect('oh-leader');

-- 3. A role it was granted is its own: a candidate of the team is chosen
-- before eve's.
SET SESSION AUTHORIZATION regress_pglease_oh_team;
SELECT status FROM lease.candidate('oh-leader', 'team-1', interval '30s', priority => 1);
SET SESSION AUTHORIZATION regress_pglease_oh_admin;
SELECT acquired, epoch FROM lease.acquire('oh-leader', 'admin-4', interval '30s');
SELECT lease.withdraw('oh-leader', 'admin-2') AS withdrawn;
SELECT owner, priority, live, rank FROM lease.candidates('oh-leader') ORDER BY owner;
SELECT status FROM lease.release('oh-leader', 'admin-4', 4);
SELECT held, owner, epoch FROM lease.inspect('oh-leader');
RESET SESSION AUTHORIZATION;
SELECT owner, holder_role FROM lease.leases WHERE key = 'oh-leader';

DELETE FROM lease.candidates WHERE key = 'oh-leader';
DELETE FROM lease.strategies WHERE key = 'oh-leader';
DELETE FROM lease.history WHERE key = 'oh-leader';
DELETE FROM lease.leases WHERE key = 'oh-leader';
DROP ROLE regress_pglease_oh_admin;
DROP ROLE regress_pglease_oh_eve;
DROP ROLE regress_pglease_oh_team;

-- 30_hostile_handover (0.5.0): another role's candidates and strategies
-- change nothing of a role's handovers. A release hands the key over only to
-- a candidate of a role the releasing role may act as (itself, or a role it
-- is a member of), under the strategy the releasing role set; another role's
-- registrations (whatever their priority or owner string) and strategies
-- neither win, refuse nor replace its own. Other roles' candidates may still
-- acquire a key that a release freed, like anyone.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE ROLE regress_pglease_hh_alice;
CREATE ROLE regress_pglease_hh_eve;
CREATE ROLE regress_pglease_hh_team;
GRANT regress_pglease_hh_team TO regress_pglease_hh_alice;

CREATE FUNCTION pg_temp.cands(k text) RETURNS TABLE (strategy text, owner text, priority integer,
    live boolean, rank bigint)
LANGUAGE sql AS $$ SELECT strategy, owner, priority, live, rank FROM lease.candidates(k) $$;

-- 1. alice holds hh-leader under her priority strategy, her follower at
-- priority 10. eve registers a candidate at the highest priority, takes the
-- owner string of alice's next follower first, and sets the key's strategy
-- to any: none of it counts for alice.
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT previous FROM lease.set_strategy('hh-leader', 'priority');
SELECT acquired, epoch FROM lease.acquire('hh-leader', 'alice-1', interval '30s');
SELECT status FROM lease.candidate('hh-leader', 'alice-2', interval '30s', priority => 10);
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT status FROM lease.candidate('hh-leader', 'eve-1', interval '30s', priority => 2147483647);
SELECT status FROM lease.candidate('hh-leader', 'alice-3', interval '30s', priority => 2147483647);
SELECT previous FROM lease.set_strategy('hh-leader', 'any');
SELECT previous FROM lease.set_strategy('hh-leader', 'newest_version');
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
-- alice registers her follower's owner string all the same, her strategy
-- is still priority, and her view ranks only her own candidates
SELECT status FROM lease.candidate('hh-leader', 'alice-3', interval '30s', priority => 5);
SELECT lease.strategy('hh-leader');
SELECT * FROM pg_temp.cands('hh-leader');
-- her release hands the key to her own follower, bound to her role
SELECT status FROM lease.release('hh-leader', 'alice-1', 1);
SELECT held, owner, epoch FROM lease.inspect('hh-leader');
-- and that one's release to alice-3, her registration (not eve's)
SELECT status FROM lease.release('hh-leader', 'alice-2', 2);
SELECT held, owner, epoch FROM lease.inspect('hh-leader');
RESET SESSION AUTHORIZATION;
SELECT owner, holder_role FROM lease.leases WHERE key = 'hh-leader';
-- no candidate of alice's left (she withdraws them, which leaves eve's
-- alice-3): her release frees the key, and eve's candidate acquires it like
-- anyone
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT lease.withdraw('hh-leader', 'alice-2') AS withdrawn, lease.withdraw('hh-leader', 'alice-3') AS withdrawn;
SELECT owner, priority, live, rank FROM pg_temp.cands('hh-leader');
SELECT status FROM lease.release('hh-leader', 'alice-3', 3);
SELECT held, owner, epoch FROM lease.inspect('hh-leader');
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT acquired, epoch FROM lease.acquire('hh-leader', 'eve-1', interval '30s');
-- eve's release follows eve's strategy (newest_version) among eve's
-- candidates: none has a version, so it frees the key
SELECT status FROM lease.release('hh-leader', 'eve-1', 5);
SELECT held, owner, epoch FROM lease.inspect('hh-leader');

-- 2. eve sets hh-jobs's strategy before alice: alice sets her own all the
-- same, and each role's release follows its own strategy.
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT previous FROM lease.set_strategy('hh-jobs', 'newest_version');
SELECT status FROM lease.candidate('hh-jobs', 'eve-j', interval '30s', version => '99.0.0');
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT previous FROM lease.set_strategy('hh-jobs', 'oldest_version');
SELECT lease.strategy('hh-jobs');
SELECT acquired, epoch FROM lease.acquire('hh-jobs', 'alice-j1', interval '30s');
SELECT status FROM lease.candidate('hh-jobs', 'alice-j2', interval '30s', version => '1.0.0');
SELECT status FROM lease.candidate('hh-jobs', 'alice-j3', interval '30s', version => '2.0.0');
SELECT status FROM lease.release('hh-jobs', 'alice-j1', 1);
SELECT held, owner, epoch FROM lease.inspect('hh-jobs');
-- eve changing her strategy again changes nothing of alice's
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT lease.strategy('hh-jobs');
SELECT previous FROM lease.set_strategy('hh-jobs', 'priority');
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT lease.strategy('hh-jobs');
SELECT status FROM lease.release('hh-jobs', 'alice-j2', 2);
SELECT held, owner, epoch FROM lease.inspect('hh-jobs');
-- alice setting any removes only her own strategy: her next release frees
-- the key, eve's strategy stays
SELECT previous FROM lease.set_strategy('hh-jobs', 'any');
SELECT status FROM lease.release('hh-jobs', 'alice-j3', 3);
SELECT held, owner, epoch FROM lease.inspect('hh-jobs');
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT lease.strategy('hh-jobs');

-- 3. Membership: alice is a member of team, so her release may hand the key
-- to team's candidate; team is not a member of alice, so team's release
-- never chooses alice's candidate.
SET SESSION AUTHORIZATION regress_pglease_hh_team;
SELECT previous FROM lease.set_strategy('hh-group', 'priority');
SELECT status FROM lease.candidate('hh-group', 'team-1', interval '30s', priority => 1);
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT previous FROM lease.set_strategy('hh-group', 'priority');
SELECT acquired, epoch FROM lease.acquire('hh-group', 'alice-g1', interval '30s');
SELECT status FROM lease.release('hh-group', 'alice-g1', 1);
SELECT held, owner, epoch FROM lease.inspect('hh-group');
SELECT status FROM lease.candidate('hh-group', 'alice-g2', interval '30s', priority => 5);
SET SESSION AUTHORIZATION regress_pglease_hh_team;
SELECT * FROM pg_temp.cands('hh-group');
SELECT status FROM lease.release('hh-group', 'team-1', 2);
SELECT held, owner, epoch FROM lease.inspect('hh-group');
RESET SESSION AUTHORIZATION;

-- 4. Bounds are per role: eve at 8192 registrations and 8192 keys with a
-- strategy is refused more (54000, nothing added); alice is not.
INSERT INTO lease.candidates (key, owner, role, pid, priority, ready, ttl, registered_at, expires_at)
SELECT 'hh-many-' || i, 'e', 'regress_pglease_hh_eve', pg_backend_pid(), 0, true, '30s',
       clock_timestamp(), clock_timestamp() + interval '30s'
  FROM generate_series(1, 8192 - (SELECT count(*) FROM lease.candidates WHERE role = 'regress_pglease_hh_eve')) i;
INSERT INTO lease.strategies (key, strategy, role, set_at)
SELECT 'hh-many-' || i, 'priority', 'regress_pglease_hh_eve', clock_timestamp()
  FROM generate_series(1, 8192 - (SELECT count(*) FROM lease.strategies WHERE role = 'regress_pglease_hh_eve')) i;
SELECT count(*) AS eve_candidates FROM lease.candidates WHERE role = 'regress_pglease_hh_eve';
SELECT count(*) AS eve_strategies FROM lease.strategies WHERE role = 'regress_pglease_hh_eve';
SET SESSION AUTHORIZATION regress_pglease_hh_eve;
SELECT status FROM lease.candidate('hh-more', 'e', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT previous FROM lease.set_strategy('hh-more', 'priority');
\echo :LAST_ERROR_SQLSTATE
SET SESSION AUTHORIZATION regress_pglease_hh_alice;
SELECT status FROM lease.candidate('hh-more', 'a', interval '30s');
SELECT previous FROM lease.set_strategy('hh-more', 'priority');
RESET SESSION AUTHORIZATION;
SELECT role, count(*) FROM lease.candidates WHERE key LIKE 'hh-%' GROUP BY role ORDER BY role;
SELECT role, count(*) FROM lease.strategies WHERE key LIKE 'hh-%' GROUP BY role ORDER BY role;

DELETE FROM lease.candidates WHERE key LIKE 'hh-%';
DELETE FROM lease.strategies WHERE key LIKE 'hh-%';
DELETE FROM lease.leases WHERE key LIKE 'hh-%';
DELETE FROM lease.history WHERE key LIKE 'hh-%';
DROP ROLE regress_pglease_hh_alice;
DROP ROLE regress_pglease_hh_eve;
DROP ROLE regress_pglease_hh_team;

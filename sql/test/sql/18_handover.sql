-- 18_handover (0.4.0): candidates, strategies and the handover on release.
-- A candidate registers for a key (lease.candidate) with a version, a
-- priority and readiness, bound to session_user and its backend; a key's
-- strategy (lease.set_strategy) says which ready candidate a release grants
-- the key to, epoch + 1, in the release's transaction. No strategy or no
-- ready candidate: the key is freed as before. Candidates of other backends
-- are inserted by hand with this backend's pid where a test needs many.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.cands(k text) RETURNS TABLE (strategy text, owner text, version text,
    priority integer, ready boolean, live boolean, rank bigint)
LANGUAGE sql AS $$ SELECT strategy, owner, version, priority, ready, live, rank FROM lease.candidates(k) $$;

-- Without a strategy (any) a release frees the key, whoever is registered.
SELECT acquired, epoch FROM lease.acquire('ho-any', 'a', interval '30s');
SELECT status FROM lease.candidate('ho-any', 'b', interval '30s', '1.0.0');
SELECT * FROM pg_temp.cands('ho-any');
SELECT status FROM lease.release('ho-any', 'a', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-any');

-- newest_version: the highest semantic version among the ready candidates
-- (a pre-release sorts below its release; not ready is never chosen).
SELECT previous FROM lease.set_strategy('ho-new', 'newest_version');
SELECT acquired, epoch FROM lease.acquire('ho-new', 'old-1', interval '30s');
SELECT status, expires_at > clock_timestamp() + interval '29s' AS ttl_30s
  FROM lease.candidate('ho-new', 'old-2', interval '30s', 'v1.30.2');
SELECT status FROM lease.candidate('ho-new', 'new-1', interval '20s', 'v1.31.0-rc.1');
SELECT status FROM lease.candidate('ho-new', 'new-2', interval '20s', '1.31.0', ready => false);
SELECT status FROM lease.candidate('ho-new', 'new-3', interval '20s', '1.31');
SELECT status FROM lease.candidate('ho-new', 'nover', interval '20s');
SELECT * FROM pg_temp.cands('ho-new');
SELECT status FROM lease.release('ho-new', 'old-1', 1);
-- new-3 (1.31.0) holds it with epoch 2, for its own ttl, bound to this role
SELECT held, owner, epoch, expires_at > clock_timestamp() + interval '19s'
       AND expires_at <= clock_timestamp() + interval '20s' AS ttl_20s
  FROM lease.inspect('ho-new');
SELECT holder_role = session_user AS bound, lapsed_owner FROM lease.leases WHERE key = 'ho-new';
-- the candidate takes up the grant: its acquire is idempotent, it renews
SELECT acquired, epoch FROM lease.acquire('ho-new', 'new-3', interval '30s');
SELECT status FROM lease.renew('ho-new', 'new-3', 2, interval '30s');
-- the former holder is told not_owner, as after any release
SELECT status FROM lease.renew('ho-new', 'old-1', 1, interval '30s');
-- the history records one term begun by a handover, with no gap before it
SELECT event, owner, epoch, previous_owner, previous_epoch, vacant_since, ttl
  FROM lease.history('ho-new') ORDER BY seq;
SELECT transitions, leaderless_seconds FROM lease.health() WHERE key = 'ho-new';
-- new-2 becomes ready; a release by new-3 (itself registered) passes over it
SELECT status FROM lease.candidate('ho-new', 'new-2', interval '20s', '1.31.0', ready => true);
SELECT status FROM lease.release('ho-new', 'new-3', 2);
SELECT held, owner, epoch FROM lease.inspect('ho-new');

-- oldest_version (Kubernetes' OldestEmulationVersion): the lowest version,
-- then the earliest registration; no version: never chosen.
SELECT previous FROM lease.set_strategy('ho-new', 'oldest_version');
SELECT * FROM pg_temp.cands('ho-new');
SELECT status FROM lease.release('ho-new', 'new-2', 3);
SELECT held, owner, epoch FROM lease.inspect('ho-new');

-- priority: the highest priority, then the earliest registration.
SELECT previous FROM lease.set_strategy('ho-prio', 'priority');
SELECT acquired, epoch FROM lease.acquire('ho-prio', 'p0', interval '30s');
SELECT status FROM lease.candidate('ho-prio', 'p1', interval '30s', priority => 1);
SELECT status FROM lease.candidate('ho-prio', 'p2', interval '30s', priority => 7);
SELECT status FROM lease.candidate('ho-prio', 'p3', interval '30s', priority => 7);
SELECT status FROM lease.candidate('ho-prio', 'p4', interval '30s', priority => 9, ready => false);
SELECT * FROM pg_temp.cands('ho-prio');
SELECT status FROM lease.release('ho-prio', 'p0', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-prio');

-- No ready candidate: the release frees the key (the waiters race).
SELECT previous FROM lease.set_strategy('ho-none', 'priority');
SELECT acquired, epoch FROM lease.acquire('ho-none', 'h', interval '30s');
SELECT status FROM lease.candidate('ho-none', 'c', interval '30s', ready => false);
SELECT status FROM lease.release('ho-none', 'h', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-none');

-- A failed release hands over nothing.
SELECT acquired, epoch FROM lease.acquire('ho-none', 'h', interval '30s');
SELECT status FROM lease.candidate('ho-none', 'c', interval '30s', ready => true);
SELECT status FROM lease.release('ho-none', 'h', 9);
SELECT status FROM lease.release('ho-none', 'x', 3);
SELECT held, owner, epoch FROM lease.inspect('ho-none');
-- nor does a lapsed one
SELECT status FROM lease.renew('ho-none', 'h', 3, interval '0.2s');
SELECT pg_sleep(0.3);
SELECT status FROM lease.release('ho-none', 'h', 3);
SELECT held, owner, epoch FROM lease.inspect('ho-none');

-- A registration lapses after its ttl unless refreshed; a refresh keeps the
-- first registration time; withdraw ends it.
SELECT previous FROM lease.set_strategy('ho-ttl', 'priority');
SELECT acquired FROM lease.acquire('ho-ttl', 'h', interval '30s');
SELECT status FROM lease.candidate('ho-ttl', 'short', interval '0.2s', priority => 5);
SELECT status FROM lease.candidate('ho-ttl', 'long', interval '30s');
SELECT registered_at AS reg0 FROM lease.candidates('ho-ttl') WHERE owner = 'long' \gset
SELECT status FROM lease.candidate('ho-ttl', 'long', interval '30s', priority => 1);
SELECT registered_at = :'reg0' AS same_registration FROM lease.candidates('ho-ttl') WHERE owner = 'long';
SELECT pg_sleep(0.3);
SELECT * FROM pg_temp.cands('ho-ttl');
SELECT lease.withdraw('ho-ttl', 'long') AS withdrawn;
SELECT lease.withdraw('ho-ttl', 'long') AS withdrawn;
SELECT status FROM lease.release('ho-ttl', 'h', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-ttl');

-- A registration ends with its backend: this one is registered from a
-- connection that then ends.
SELECT previous FROM lease.set_strategy('ho-conn', 'priority');
SELECT acquired FROM lease.acquire('ho-conn', 'h', interval '30s');
SELECT pg_backend_pid() AS first_pid \gset
SELECT status FROM lease.candidate('ho-conn', 'gone', interval '30s');
\c
-- wait (at most 60 s) until the first backend has exited
SELECT set_config('regress.first_pid', :'first_pid', false) IS NOT NULL AS noted;
DO $$
BEGIN
  FOR i IN 1..1200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity
                           WHERE pid = current_setting('regress.first_pid')::integer);
    PERFORM pg_sleep(0.05);
  END LOOP;
END
$$;
SELECT owner, live, rank FROM lease.candidates('ho-conn');
SELECT status FROM lease.release('ho-conn', 'h', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-conn');
\set VERBOSITY default
\set SHOW_CONTEXT never
CREATE FUNCTION pg_temp.cands(k text) RETURNS TABLE (strategy text, owner text, version text,
    priority integer, ready boolean, live boolean, rank bigint)
LANGUAGE sql AS $$ SELECT strategy, owner, version, priority, ready, live, rank FROM lease.candidates(k) $$;

-- Roles: a registration, like a grant, is bound to session_user, and so is
-- a strategy (0.5.0: each role's registrations and strategy are its own
-- rows). Another role registering the same owner string makes a
-- registration of its own, and its withdraw and set_strategy touch only its
-- own. A release chooses among the candidates of roles the releasing role
-- may act as, under the strategy that role set; the candidate's grant is
-- bound to the candidate's role. (30_hostile_handover: what another role can
-- no longer do.)
CREATE ROLE regress_pglease_ho_alice;
CREATE ROLE regress_pglease_ho_mallory;
SET SESSION AUTHORIZATION regress_pglease_ho_alice;
SELECT previous FROM lease.set_strategy('ho-role', 'priority');
SELECT acquired FROM lease.acquire('ho-role', 'a1', interval '30s');
SELECT status FROM lease.candidate('ho-role', 'a2', interval '30s', priority => 1);
SET SESSION AUTHORIZATION regress_pglease_ho_mallory;
-- mallory's a2 is her own registration; withdrawing it leaves alice's
SELECT status FROM lease.candidate('ho-role', 'a2', interval '30s', priority => 9);
SELECT lease.withdraw('ho-role', 'a2') AS withdrawn;
SELECT lease.withdraw('ho-role', 'a2') AS withdrawn_again;
-- her strategy of the key is her own: none, and setting any leaves alice's
SELECT lease.strategy('ho-role');
SELECT previous FROM lease.set_strategy('ho-role', 'any');
SELECT status FROM lease.candidate('ho-role', 'm1', interval '30s', priority => 0);
-- she sees both candidates, but her strategy is any: her release would
-- choose neither
SELECT * FROM pg_temp.cands('ho-role');
-- the tables are closed to her
SELECT * FROM lease.candidates;
\echo :LAST_ERROR_SQLSTATE
UPDATE lease.strategies SET strategy = 'priority';
\echo :LAST_ERROR_SQLSTATE
SET SESSION AUTHORIZATION regress_pglease_ho_alice;
-- alice's view: her strategy, her candidate first, mallory's not choosable
SELECT * FROM pg_temp.cands('ho-role');
SELECT status FROM lease.release('ho-role', 'a1', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-role');
RESET SESSION AUTHORIZATION;
SELECT holder_role FROM lease.leases WHERE key = 'ho-role';
-- a2's grant is alice's: mallory presenting it is told not_owner
SET SESSION AUTHORIZATION regress_pglease_ho_mallory;
SELECT status FROM lease.renew('ho-role', 'a2', 2, interval '30s');
-- a release by alice never hands it to mallory's candidate: the key is free
SET SESSION AUTHORIZATION regress_pglease_ho_alice;
SELECT status FROM lease.release('ho-role', 'a2', 2);
RESET SESSION AUTHORIZATION;
SELECT owner, epoch, holder_role FROM lease.leases WHERE key = 'ho-role';
-- a superuser (a member of every role) chooses, like any role, only among
-- the candidates of its own role and of the roles it was granted: neither
-- alice's a2 nor mallory's m1 (60_operator_handover), so the key is freed
SELECT previous FROM lease.set_strategy('ho-role', 'priority');
SELECT acquired FROM lease.acquire('ho-role', 'root', interval '30s');
SELECT status FROM lease.release('ho-role', 'root', 4);
SELECT owner, epoch, holder_role FROM lease.leases WHERE key = 'ho-role';
-- a candidate whose role was dropped is never chosen
SET SESSION AUTHORIZATION regress_pglease_ho_alice;
SELECT status FROM lease.candidate('ho-role', 'a3', interval '30s', priority => 5);
RESET SESSION AUTHORIZATION;
DELETE FROM lease.candidates WHERE role = 'regress_pglease_ho_mallory';
DELETE FROM lease.leases WHERE key = 'ho-role';
SELECT acquired FROM lease.acquire('ho-role', 'root', interval '30s');
DROP OWNED BY regress_pglease_ho_alice;
DROP ROLE regress_pglease_ho_alice;
SELECT owner, live, rank FROM lease.candidates('ho-role');
SELECT status FROM lease.release('ho-role', 'root', 1);
SELECT held, owner FROM lease.inspect('ho-role');
DELETE FROM lease.candidates WHERE key = 'ho-role';
DELETE FROM lease.strategies WHERE key = 'ho-role';
DROP ROLE regress_pglease_ho_mallory;

-- Bounded storage: at most 8192 registrations per role (54000 beyond), and
-- as many keys with a strategy. Refreshing an existing one is always fine;
-- a role's registrations that are gone are dropped when it registers anew.
DELETE FROM lease.candidates;
DELETE FROM lease.strategies;
INSERT INTO lease.candidates (key, owner, role, pid, priority, ready, ttl, registered_at, expires_at)
SELECT 'ho-many', 'c' || i, session_user, pg_backend_pid(), 0, true, '30s', clock_timestamp(), clock_timestamp() + interval '30s'
  FROM generate_series(1, 8192) i;
SELECT status FROM lease.candidate('ho-many', 'c1', interval '30s');
SELECT status FROM lease.candidate('ho-many', 'one-more', interval '30s');
\echo :LAST_ERROR_SQLSTATE
UPDATE lease.candidates SET expires_at = clock_timestamp() WHERE key = 'ho-many' AND owner = 'c2';
SELECT status FROM lease.candidate('ho-many', 'one-more', interval '30s');
SELECT count(*) FROM lease.candidates WHERE key = 'ho-many';
DELETE FROM lease.candidates WHERE key = 'ho-many';
INSERT INTO lease.strategies (key, strategy, role, set_at)
SELECT 'ho-s' || i, 'priority', session_user, clock_timestamp() FROM generate_series(1, 8192) i;
SELECT previous FROM lease.set_strategy('ho-s1', 'newest_version');
SELECT previous FROM lease.set_strategy('ho-s-more', 'priority');
\echo :LAST_ERROR_SQLSTATE
SELECT previous FROM lease.set_strategy('ho-s1', 'any');
SELECT previous FROM lease.set_strategy('ho-s-more', 'priority');
DELETE FROM lease.strategies WHERE key LIKE 'ho-s%';

-- A tie under priority: the earlier registration first, whatever the
-- versions (a pre-release registered later does not move ahead).
SELECT status FROM lease.candidate('ho-tie', 'early', interval '30s', '2.0.0', 5);
SELECT status FROM lease.candidate('ho-tie', 'late', interval '30s', '2.0.0-rc.1', 5);
SELECT previous FROM lease.set_strategy('ho-tie', 'priority');
SELECT owner, version, priority, rank FROM pg_temp.cands('ho-tie');
SELECT lease.withdraw('ho-tie', 'early') AND lease.withdraw('ho-tie', 'late') AS withdrawn;
DELETE FROM lease.strategies WHERE key = 'ho-tie';

-- Invalid input: 22023 with every violation named; nothing changes.
SELECT status FROM lease.candidate('ho-bad', 'o', interval '30s', '1.0.0');
SELECT md5(coalesce(string_agg(c::text, ',' ORDER BY c.key, c.owner), '')) AS c0 FROM lease.candidates c \gset
SELECT * FROM lease.candidate(NULL, '', interval '0', 'one', NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.candidate('ho-bad', 'o', interval '2 hours', repeat('1', 257));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.candidate(E'ho\tbad', 'o', interval '30s', '1.2.3.4');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.withdraw('', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.set_strategy('ho-bad', 'fastest');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.set_strategy(NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.candidates(repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT md5(coalesce(string_agg(c::text, ',' ORDER BY c.key, c.owner), '')) = :'c0' AS unchanged FROM lease.candidates c;
-- The version's bound: 256 bytes are accepted, 257 refused.
SELECT status FROM lease.candidate('ho-bad', 'o', interval '30s', '1.0.0-' || repeat('a', 250));
SELECT octet_length(version) AS version_bytes FROM lease.candidates('ho-bad');
SELECT * FROM lease.candidate('ho-bad', 'o', interval '30s', '1.0.0-' || repeat('a', 251));
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM lease.candidate('ho-bad', 'o', interval '30s', '1.0.0');
-- versions Kubernetes accepts (tolerant semantic versions; a pre-release
-- without a patch number sorts below its release too)
SELECT v, (lease._version_parts(v)).* FROM unnest(ARRAY['1', 'v1.2', ' V1.2.3 ', '1.2.3-rc.1+build.5',
       '1.2.3-alpha', '1.2.3-alpha.10', '1.2.3-alpha.9', '1.2.3-beta', '1.2-rc.1']) v ORDER BY 2, 3 NULLS LAST;

-- Read-only: every registering function raises 25006.
BEGIN READ ONLY;
SELECT * FROM lease.candidate('ho-ro', 'o', interval '30s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM lease.set_strategy('ho-ro', 'priority');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT lease.withdraw('ho-ro', 'o');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT count(*) FROM lease.candidates('ho-ro');
ROLLBACK;

-- The grace after a timeline change (a simulated promotion): no handover, a
-- release frees the key.
SELECT previous FROM lease.set_strategy('ho-grace', 'priority');
SELECT acquired, epoch FROM lease.acquire('ho-grace', 'h', interval '30s');
SELECT status FROM lease.candidate('ho-grace', 'c', interval '30s');
UPDATE lease.timeline_state SET timeline = 0;
CHECKPOINT;  -- a promotion requests one at once: the grace runs from it
SELECT status FROM lease.release('ho-grace', 'h', 1);
SELECT held, owner, epoch FROM lease.inspect('ho-grace');
SELECT era > 0 AS new_era, grace_until > clock_timestamp() AS in_grace FROM lease.status();
DELETE FROM lease.leases WHERE key = 'ho-grace';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

DELETE FROM lease.candidates;
DELETE FROM lease.strategies;

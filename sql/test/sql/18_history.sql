-- 18_history (0.4.0): every grant, takeover, release, forced release and
-- promotion grace of a key is recorded, with who (owner, role, the role that
-- made the call), the epoch, when and why; calls that change nothing record
-- nothing; each key keeps the last history_rows events of each role that
-- made events of it; lease.history and lease.health are open to every role
-- (which sees the roles it is a member of: 31_hostile_history), the table
-- and the settings are not.
-- Times are projected to booleans.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE ROLE regress_pglease_hist_app;
CREATE ROLE regress_pglease_hist_op;
CREATE ROLE regress_pglease_hist_mallory;
GRANT EXECUTE ON FUNCTION lease.force_release(text) TO regress_pglease_hist_op;

CREATE FUNCTION pg_temp.hist(k text) RETURNS TABLE (seq bigint, event text, owner text, holder_role text,
    epoch bigint, actor text, previous_owner text, previous_epoch bigint, vacant boolean, ttl interval, detail text)
LANGUAGE sql AS $$
  SELECT h.seq, h.event, h.owner, h.holder_role, h.epoch, h.actor, h.previous_owner, h.previous_epoch,
         h.vacant_since IS NOT NULL AND h.vacant_since <= h.at, h.ttl, h.detail
    FROM lease.history(k) h
$$;

-- A key's life: a first grant, a release, a grant of the free key, a lapse
-- and a takeover by another owner, an operator's forced release, a grant.
SET SESSION AUTHORIZATION regress_pglease_hist_app;
SELECT acquired, epoch FROM lease.acquire('hist-1', 'a1', interval '30s');
SELECT status FROM lease.release('hist-1', 'a1', 1);
SELECT acquired, epoch FROM lease.acquire('hist-1', 'a1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('hist-1', 'b2', interval '30s');
SET SESSION AUTHORIZATION regress_pglease_hist_op;
SELECT released, previous_owner, epoch FROM lease.force_release('hist-1');
SET SESSION AUTHORIZATION regress_pglease_hist_app;
SELECT acquired, epoch FROM lease.acquire('hist-1', 'b2', interval '30s');
RESET SESSION AUTHORIZATION;
SELECT * FROM pg_temp.hist('hist-1');
-- events are in order on the server's clock
SELECT bool_and(h.at >= p.at) AS ordered
  FROM lease.history('hist-1') h JOIN lease.history('hist-1') p ON p.seq = h.seq - 1;
SET SESSION AUTHORIZATION regress_pglease_hist_app;

-- Calls that change nothing record nothing: an idempotent re-acquire, a
-- denied acquire, a renewal, failed renewals and releases, a forced release
-- of a free key, inspect, list, fence.
SELECT count(*) AS events FROM lease.history('hist-1') \gset
SELECT acquired FROM lease.acquire('hist-1', 'b2', interval '30s');
SELECT acquired FROM lease.acquire('hist-1', 'c3', interval '30s');
SELECT status FROM lease.renew('hist-1', 'b2', 6, interval '30s');
SELECT status FROM lease.renew('hist-1', 'b2', 5, interval '30s');
SELECT status FROM lease.release('hist-1', 'c3', 6);
SELECT count(*) FROM lease.inspect('hist-1');
SELECT lease.fence('hist-1', 'b2', 6) IS NOT NULL AS fenced;
RESET SESSION AUTHORIZATION;
SELECT status FROM lease.release('hist-1', 'b2', 6);
SELECT released FROM lease.force_release('hist-1');
SELECT count(*) = :events + 1 AS only_the_release FROM lease.history('hist-1');
-- a change rolled back takes its event with it
BEGIN;
SELECT acquired FROM lease.acquire('hist-1', 'd4', interval '30s');
ROLLBACK;
SELECT count(*) = :events + 1 AS rolled_back FROM lease.history('hist-1');

-- A blocking acquire that takes over at the holder's expiry: one takeover,
-- however many polls it made.
SELECT acquired FROM lease.acquire('hist-w', 'h', interval '0.3s');
SELECT acquired, epoch FROM lease.acquire('hist-w', 'w', interval '30s', wait => interval '5s');
SELECT * FROM pg_temp.hist('hist-w');

-- health: every key, as list reports it, with the term, the time without a
-- holder, the terms begun and the time without a holder in the period.
SELECT key, held, owner, holder_role, epoch, ttl, grants, transitions,
       term_started IS NOT NULL AS has_term, vacant_since IS NOT NULL AS vacant,
       leaderless_seconds > 0 AS some_leaderless, leaderless_seconds < 60 AS bounded,
       history_since <= observed_at AS has_history
  FROM lease.health() WHERE key LIKE 'hist-%' ORDER BY key;
-- hist-1 is free: its time without a holder grows with the clock
SELECT pg_sleep(0.2);
SELECT h.leaderless_seconds >= 0.2 AS counts_the_current_gap,
       h.leaderless_seconds >= extract(epoch FROM h.observed_at - h.vacant_since) AS gap_since_release
  FROM lease.health() h WHERE h.key = 'hist-1';
-- a period that begins after the events: no transition, and the current
-- gap counts only within the period
SELECT key, held, transitions, leaderless_seconds <= 0.05 AS within_period, leaderless_seconds > 0 AS some_leaderless
  FROM lease.health(interval '0.05 s') WHERE key LIKE 'hist-%' ORDER BY key;
-- health of a key granted before any history (written by hand): no counter
INSERT INTO lease.leases (key, owner, epoch, expires_at, acquired_at, holder_role)
  VALUES ('hist-old', 'o', 7, clock_timestamp() + interval '1 hour', clock_timestamp(), session_user);
SELECT key, held, grants, transitions, leaderless_seconds, history_since, ttl FROM lease.health() WHERE key = 'hist-old';
DELETE FROM lease.leases WHERE key = 'hist-old';

-- Retention: the last keep_rows events of each key and role (0.5.0): hist-1's
-- events were made by app (seqs 1-4, 6), op (5) and the superuser (7); with
-- 3 kept, app's oldest two go. Numbering goes on.
SELECT * FROM lease.configure_history();
SELECT * FROM lease.configure_history(3);
SELECT seq, event FROM lease.history('hist-1');
SELECT acquired FROM lease.acquire('hist-1', 'e5', interval '30s');
SELECT seq, event, owner FROM lease.history('hist-1');
SELECT key, count(*) AS rows_kept, min(seq), max(seq) FROM lease.history
 WHERE key LIKE 'hist-%' GROUP BY key ORDER BY key;
-- max_rows bounds what history returns, the newest kept
SELECT seq FROM lease.history('hist-1', 2);
-- 0 keeps nothing and records nothing; back to the default, a key's
-- numbering (and its grants counter) starts again
SELECT * FROM lease.configure_history(0);
SELECT count(*) AS stored FROM lease.history;
SELECT status FROM lease.release('hist-1', 'e5', 8);
SELECT count(*) AS stored FROM lease.history;
SELECT * FROM lease.configure_history(100);
SELECT acquired FROM lease.acquire('hist-1', 'f6', interval '30s');
SELECT seq, event, owner, epoch FROM lease.history('hist-1');
SELECT grants FROM lease.health() WHERE key = 'hist-1';

-- Invalid input: 22023 with DETAIL, nothing changed.
SELECT * FROM lease.history(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.history('', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.history('hist-1', 10001);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.health(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.health(interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.health(interval '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.health(interval '101 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure_history(-1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure_history(100001);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure_history();
-- The bound itself is accepted.
SELECT * FROM lease.configure_history(100000);
SELECT * FROM lease.configure_history(100);
-- Read-only: configure_history raises read_only (25006) with its own message.
BEGIN READ ONLY;
SELECT * FROM lease.configure_history(5);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Every role reads history and health through the functions; no role but
-- the owner reads or writes the tables, calls the recorder or sets the
-- retention.
SET SESSION AUTHORIZATION regress_pglease_hist_mallory;
SELECT count(*) > 0 AS reads_history FROM lease.history('hist-1');
SELECT count(*) > 0 AS reads_health FROM lease.health() WHERE key = 'hist-1';
SELECT * FROM lease.history;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO lease.history (key, seq, at, event, actor, grants) VALUES ('hist-1', 99, now(), 'released', 'x', 0);
\echo :LAST_ERROR_SQLSTATE
DELETE FROM lease.history;
\echo :LAST_ERROR_SQLSTATE
SELECT lease._record('hist-1', 'released', false, 'x', NULL, 1, NULL, NULL, NULL, NULL, NULL, now());
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure_history(1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.history_settings;
\echo :LAST_ERROR_SQLSTATE
-- mallory's own calls are recorded under her role, for her keys only
SELECT acquired FROM lease.acquire('hist-m', 'm', interval '30s');
SELECT status FROM lease.release('hist-1', 'f6', 10);
RESET SESSION AUTHORIZATION;
SELECT * FROM pg_temp.hist('hist-m');
SELECT seq, event, owner FROM lease.history('hist-1') ORDER BY seq DESC LIMIT 1;

-- Clean-up removes a free key's history with the key (in a transaction
-- rolled back: the other files' free keys and the floor stay as they are).
SELECT status FROM lease.release('hist-w', 'w', 2);
BEGIN;
SELECT removed > 0 AS removed FROM lease.cleanup(interval '0', 100000);
SELECT count(*) AS history_left FROM lease.history WHERE key = 'hist-w';
SELECT count(*) AS orphans FROM lease.history h WHERE NOT EXISTS (SELECT 1 FROM lease.leases l WHERE l.key = h.key);
ROLLBACK;

-- A promotion (the recorded timeline older than the server's, as in
-- 15_timeline) with max_ttl 1 s: the first grant of a released key after
-- the grace records the grace before the grant, with its end.
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl) VALUES (interval '1 s');
SELECT acquired FROM lease.acquire('hist-g', 'g1', interval '1 s');
SELECT status FROM lease.release('hist-g', 'g1', 1);
UPDATE lease.timeline_state SET timeline = 0;
CHECKPOINT;  -- a promotion requests one at once: the grace runs from it
SELECT acquired FROM lease.acquire('hist-g', 'g2', interval '1 s');
SELECT acquired, epoch = (1::bigint << 40) + 1 AS new_era
  FROM lease.acquire('hist-g', 'g2', interval '1 s', wait => interval '3 s');
SELECT seq, event, owner, epoch = (1::bigint << 40) + 1 AS new_era, vacant,
       detail LIKE 'no new grant before % the grace after a timeline change (promotion)' AS says_why
  FROM pg_temp.hist('hist-g');
SELECT transitions, leaderless_seconds > 0.5 AS grace_counted FROM lease.health() WHERE key = 'hist-g';
DELETE FROM lease.settings;
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

DELETE FROM lease.leases WHERE key LIKE 'hist-%';
DELETE FROM lease.history WHERE key LIKE 'hist-%';
REVOKE EXECUTE ON FUNCTION lease.force_release(text) FROM regress_pglease_hist_op;
DROP ROLE regress_pglease_hist_app;
DROP ROLE regress_pglease_hist_op;
DROP ROLE regress_pglease_hist_mallory;

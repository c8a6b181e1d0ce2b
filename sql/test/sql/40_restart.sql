-- 40_restart (0.5.0): a restart without a promotion. lease.timeline_state
-- records the postmaster start beside the timeline and era; a server whose
-- postmaster start differs on the same timeline (a restarted primary, or a
-- standby ended by a restart without standby.signal, which SQL cannot tell
-- apart) may lack its last commits: the next grant path or renewal moves to
-- the next restart of the era (epochs above era * 2^40 + restarts * 2^24)
-- and starts the grace. A single server is not restarted here: the recorded
-- start is moved instead. A real restart: pkg/lease
-- TestRestartMovesEpochBaseAndStartsGrace, test/failover
-- TestStandbyEndedWithoutPromotion.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The SQLSTATE and DETAIL of a statement's error, the postmaster start in it
-- replaced (its text depends on when the server started).
CREATE FUNCTION pg_temp.error_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE d text;
BEGIN
  EXECUTE q;
  RETURN 'no error';
EXCEPTION WHEN OTHERS OR query_canceled THEN
  GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
  RETURN SQLSTATE || ': ' || regexp_replace(d, 'postmaster started at [^)]*', 'postmaster started at <start>');
END $$;
-- The state (lease.status() shows era, not restarts).
CREATE FUNCTION pg_temp.state(OUT era bigint, OUT restarts integer, OUT grace_from_start text) LANGUAGE sql AS $$
  SELECT t.era, t.restarts,
         CASE WHEN t.grace_until IS NULL THEN 'no grace'
              WHEN t.grace_until = t.started + lease._grace() THEN 'start + grace'
              ELSE 'other' END
    FROM lease.timeline_state t
   ORDER BY t.era DESC, t.restarts DESC, t.grace_until ASC NULLS FIRST, t.timeline DESC, t.started DESC NULLS LAST
   LIMIT 1
$$;

-- An install records the postmaster start; calls on that server add no row.
-- (A fresh install: earlier files left rows made by hand.)
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT started = pg_postmaster_start_time() AS start_recorded, era, restarts FROM lease.timeline_state;
SELECT acquired, epoch FROM lease.acquire('rs-1', 'h', interval '30s');
SELECT status FROM lease.renew('rs-1', 'h', 1, interval '30s');
SELECT count(*) AS state_rows FROM lease.timeline_state;

-- A row of 0.4.0 (start not known, no restarts): the next call records the
-- start, with the same base and no grace.
UPDATE lease.timeline_state SET started = NULL;
SELECT acquired, epoch FROM lease.acquire('rs-2', 'h', interval '30s');
SELECT count(*) AS state_rows, count(*) FILTER (WHERE started = pg_postmaster_start_time()) AS with_start
  FROM lease.timeline_state;
SELECT * FROM pg_temp.state();
DELETE FROM lease.leases WHERE key = 'rs-2';

-- A restart: the recorded start is before the server's. Promotion mode
-- 'any' (the default), max_ttl 10 years (set long ago, so that the grace
-- outlasts the test however long ago the server started): the first grant
-- path moves to the era's first restart, and no new grant is made before
-- the postmaster start + 10 years (measured from the start, not from the
-- call). The denial says when the grace ends.
INSERT INTO lease.settings (max_ttl) VALUES (interval '10 years');
SELECT status FROM lease.release('rs-1', 'h', 1);
SELECT acquired FROM lease.acquire('rs-held', 'h', interval '30s');
UPDATE lease.timeline_state SET started = started - interval '1 min';
SELECT acquired, epoch, expires_at = pg_postmaster_start_time() + interval '10 years' AS grace_from_start
  FROM lease.acquire('rs-1', 'n', interval '30s');
SELECT * FROM pg_temp.state();
SELECT era, grace_until = pg_postmaster_start_time() + interval '10 years' AS grace_from_start FROM lease.status();
-- Renewals go on in the grace; a held key stays its holder's.
SELECT status FROM lease.renew('rs-held', 'h', 1, interval '30s');
SELECT acquired FROM lease.acquire('rs-held', 'h', interval '30s');
-- A blocking acquire whose wait ends inside the grace: timeout, naming the restart.
SELECT pg_temp.error_of($q$SELECT lease.acquire('rs-1', 'n', interval '30s', wait => interval '0.05 s')$q$);
-- One row per change: further calls add none.
SELECT acquired FROM lease.acquire('rs-1', 'n', interval '30s');
SELECT status FROM lease.renew('rs-held', 'h', 1, interval '30s');
SELECT era, restarts, count(*) AS state_rows FROM lease.timeline_state GROUP BY era, restarts ORDER BY era, restarts;

-- The grace runs from the postmaster start: with max_ttl 1 s (set long
-- ago), the grace of a restart a minute ago has ended: the next grant is
-- made at once, above the restart's base: 2^24 + 1.
DELETE FROM lease.leases WHERE key = 'rs-held';
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl) VALUES (interval '1 s');
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era, started)
  VALUES (lease._timeline(), 0, pg_postmaster_start_time() - interval '1 min');
SELECT acquired, epoch = (1::bigint << 24) + 1 AS restart_1 FROM lease.acquire('rs-1', 'n', interval '1s');
SELECT * FROM pg_temp.state();
SELECT status FROM lease.release('rs-1', 'n', (1::bigint << 24) + 1);

-- A recorded start after the server's (a clock or a cluster that cannot be
-- placed): one more restart, and the grace from the call. A blocking acquire
-- waits it out and gets the freed key above the second restart's base; the
-- history records the grace that withheld the grant, naming the restart.
UPDATE lease.timeline_state SET started = pg_postmaster_start_time() + interval '1 min';
SELECT acquired, expires_at > clock_timestamp() + interval '0.5 s' AS grace_from_now
  FROM lease.acquire('rs-1', 'n', interval '1s');
SELECT acquired, epoch = (2::bigint << 24) + 1 AS restart_2
  FROM lease.acquire('rs-1', 'n', interval '1s', wait => interval '5 s');
SELECT l.acquired_at >= s.grace_until AS after_grace FROM lease.leases l, lease.status() s WHERE l.key = 'rs-1';
SELECT event, regexp_replace(detail, 'before .*: the grace', 'before <end>: the grace')
         ~ '^no new grant before <end>: the grace after a restart of the server without a promotion \(timeline \d+, postmaster started at .*\)$' AS names_restart
  FROM lease.history('rs-1') WHERE event = 'promotion_grace';

-- Promotion mode 'synchronous': the base moves, no grace.
DELETE FROM lease.leases WHERE key LIKE 'rs-%';
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl, promotion) VALUES (interval '10 years', 'synchronous');
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era, started)
  VALUES (lease._timeline(), 0, pg_postmaster_start_time() - interval '1 min');
SELECT acquired, epoch = (1::bigint << 24) + 1 AS restart_1 FROM lease.acquire('rs-4', 'n', interval '1s');
SELECT s.era, s.grace_until <= clock_timestamp() AS no_grace FROM lease.status() s;

-- A renewal records the restart too (the grace starts at the first call,
-- whatever it is). The grant was made in the life before: its row carries
-- that life's start.
UPDATE lease.settings SET promotion = NULL;
UPDATE lease.timeline_state SET started = started - interval '1 min' WHERE restarts = 1;
UPDATE lease.leases SET life = life - interval '1 min' WHERE key = 'rs-4';
SELECT status FROM lease.renew('rs-4', 'n', (1::bigint << 24) + 1, interval '1s');
SELECT * FROM pg_temp.state();
-- The row now carries this life: its next renewal has nothing to record.
SELECT life = pg_postmaster_start_time() AS this_life FROM lease.leases WHERE key = 'rs-4';

-- After the era's last restart (65535) the next one moves to the next era.
DELETE FROM lease.leases WHERE key LIKE 'rs-%';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era, restarts, started)
  VALUES (lease._timeline(), 3, 65535, pg_postmaster_start_time() - interval '1 hour');
SELECT acquired FROM lease.acquire('rs-6', 'n', interval '1s');
SELECT * FROM pg_temp.state();

-- A promotion after restarts: a standby that recorded era 3 with 7
-- restarts (its primary may have restarted more since, with epochs above
-- 3 * 2^40 + 8 * 2^24 ...) moves to era 4 with no restart, above every epoch
-- of era 3. A timeline change seen with a new start is one change, the new
-- start recorded with it.
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era, restarts, started)
  VALUES (lease._timeline() - 1, 3, 7, pg_postmaster_start_time() - interval '1 hour');
SELECT acquired FROM lease.acquire('rs-5', 'n', interval '1s');
SELECT s.era, s.restarts, t.started = pg_postmaster_start_time() AS start_recorded
  FROM pg_temp.state() s JOIN lease.timeline_state t ON t.era = s.era AND t.restarts = s.restarts;

-- Back to the state of a fresh install.
DELETE FROM lease.leases WHERE key LIKE 'rs-%';
DELETE FROM lease.history WHERE key LIKE 'rs-%';
DELETE FROM lease.settings;
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era, started) VALUES (lease._timeline(), 0, pg_postmaster_start_time());

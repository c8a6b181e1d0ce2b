-- 96_renew_life (0.5.0): renew's common case trusts a row's server life,
-- the postmaster start and the WAL timeline of its last grant or full-way
-- renewal. One postmaster can write on two timelines: a crash restart keeps
-- it, with standby.signal present it comes back as a standby, and a
-- promotion moves it to a new timeline. The timeline of the row's life is
-- moved back here instead (a real one: pkg/lease
-- TestRenewalRecordsPromotionAfterCrashRestart).
\set VERBOSITY default
\set SHOW_CONTEXT never

DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
-- max_ttl 10 years: the grace (from the timeline's start) outlasts the
-- test whenever the server started.
SELECT configured_max_ttl FROM lease.configure(max_ttl => '10 years');
CREATE FUNCTION pg_temp.life(k text) RETURNS text LANGUAGE sql AS $$
  SELECT CASE WHEN l.life IS NULL AND l.life_timeline IS NULL THEN 'none'
              WHEN l.life = pg_postmaster_start_time() AND l.life_timeline = lease._timeline() THEN 'this life'
              ELSE 'other' END
    FROM lease.leases l WHERE l.key = k
$$;

-- A grant carries this life; its renewals record nothing.
SELECT acquired, epoch FROM lease.acquire('rl-1', 'o', interval '1 hour');
SELECT pg_temp.life('rl-1');
SELECT status FROM lease.renew('rl-1', 'o', 1, interval '1 hour');
SELECT count(*) AS state_rows FROM lease.timeline_state;

-- The same postmaster on a later timeline: the record and the row are of
-- the timeline before. The first renewal records the promotion (the next
-- era, the grace starts) and moves the row to this life.
UPDATE lease.timeline_state SET timeline = timeline - 1;
UPDATE lease.leases SET life_timeline = life_timeline - 1 WHERE key = 'rl-1';
SELECT pg_temp.life('rl-1');
SELECT status FROM lease.renew('rl-1', 'o', 1, interval '1 hour');
SELECT s.timeline = lease._timeline() AS recorded, s.era, s.grace_until > clock_timestamp() AS in_grace
  FROM lease.status() s;
SELECT pg_temp.life('rl-1');
SELECT count(*) AS state_rows FROM lease.timeline_state;

-- A refused renewal of a row of another life records nothing and leaves
-- the row as it was.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT acquired, epoch FROM lease.acquire('rl-2', 'o', interval '1 hour');
UPDATE lease.timeline_state SET timeline = timeline - 1;
UPDATE lease.leases SET life_timeline = life_timeline - 1 WHERE key = 'rl-2';
SELECT status FROM lease.renew('rl-2', 'o', 2, interval '1 hour');
SELECT status FROM lease.renew('rl-2', 'x', 1, interval '1 hour');
SELECT count(*) AS state_rows FROM lease.timeline_state;
SELECT pg_temp.life('rl-2');

-- A row that no grant of 0.3.0 or later made (0.1.0 and 0.2.0 took keys
-- with control characters; an update leaves its life unknown) goes the
-- full way and is refused as bad input, unchanged.
INSERT INTO lease.leases (key, owner, epoch, expires_at, acquired_at)
  VALUES (E'rl-\x01', 'o', 1, clock_timestamp() + interval '1 hour', clock_timestamp());
SELECT status FROM lease.renew(E'rl-\x01', 'o', 1, interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.life(E'rl-\x01');

-- Leave a fresh install for the files after this one.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;

-- 15_timeline (0.3.0): epochs across promotions, the grace after one, the
-- enforced max_ttl, and read-only sessions. A single server cannot be
-- promoted, so a promotion is simulated the way the SQL sees one: the
-- timeline recorded in lease.timeline_state differs from the server's current
-- one (read with pg_walfile_name(pg_current_wal_lsn()), which nothing here can
-- fake). Real promotions are tested by the Go harness (test/failover).
\set VERBOSITY default
\set SHOW_CONTEXT never

-- A cluster that never failed over: timeline 1, era 0, epochs 1, 2, 3.
SELECT lease._timeline() AS server_timeline;
SELECT timeline, era, grace_until FROM lease.status();
SELECT acquired, epoch FROM lease.acquire('tl-1', 'h', interval '30s');
SELECT status FROM lease.release('tl-1', 'h', 1);
SELECT acquired, epoch FROM lease.acquire('tl-1', 'h', interval '30s');
SELECT acquired, epoch FROM lease.acquire('tl-2', 'h', interval '30s');

-- max_ttl: the default is 1 hour; a longer ttl is invalid input (acquire and
-- renew), nothing changes.
SELECT max_ttl, promotion_grace FROM lease.status();
SELECT * FROM lease.acquire('tl-long', 'h', interval '1 hour 1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('tl-1', 'h', 3, interval '2 hours');
\echo :LAST_ERROR_SQLSTATE
SELECT acquired FROM lease.acquire('tl-long', 'h', interval '1 hour');
SELECT status FROM lease.release('tl-long', 'h', 1);
-- configure validates, and a lower max_ttl keeps the old one as the grace for
-- the old one's duration (grants made under it may still be believed); a
-- higher one applies at once.
SELECT * FROM lease.configure(max_ttl => interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure(max_ttl => interval '-1s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure(max_ttl => interval '101 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure();
SELECT * FROM lease.configure(max_ttl => interval '10 s');
SELECT * FROM lease.acquire('tl-long', 'h', interval '11 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure(max_ttl => interval '2 hours');
SELECT * FROM lease.configure(max_ttl => interval '1 day 1 hour');
SELECT * FROM lease.configure(max_ttl => interval '100 years');  -- the bound itself is allowed
SELECT * FROM lease.configure(max_ttl => interval '1 hour');

SELECT configured_max_ttl FROM lease.configure(max_ttl => interval '0.5 s');  -- below 1 s is fine
-- The carried-over grace ends with its window: after prev_until the grace is
-- the lower max_ttl alone (not the earlier, higher one for ever).
-- (One transaction: the window is read on the clock, not at its start.)
BEGIN;
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl, prev_max_ttl, prev_until)
  VALUES (interval '0.1 s', interval '0.4 s', clock_timestamp() + interval '0.4 s');
SELECT * FROM lease.configure();
SELECT pg_sleep(0.5);
SELECT * FROM lease.configure();
COMMIT;

-- A promotion: the recorded timeline (0 here) is older than the server's,
-- and the latest checkpoint is on the server's timeline (a promotion requests
-- one at once; 0.4.0 measures the grace from it).
-- An operator configured max_ttl = 1 s long ago (the settings row written
-- directly, so no higher earlier max_ttl is still in force).
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl) VALUES (interval '1 s');
UPDATE lease.timeline_state SET timeline = 0;
CHECKPOINT;
-- A denied acquire (tl-2 is h's) is no grant path: it does not look at the
-- timeline, so the change is not recorded yet and no grace has begun.
SELECT acquired FROM lease.acquire('tl-2', 'intruder', interval '1 s');
SELECT timeline = 0 AS change_not_recorded, grace_until IS NULL AS no_grace FROM lease.status();
-- The holder of tl-2 (replicated) renews during the grace; an idempotent
-- re-acquire of that earlier-era grant is refused until the grace ends (its
-- release may have been lost with the old primary while a successor's lost
-- grant is still believed); nothing else is granted before it ends either: a
-- free key, a new key, a lapsed one.
SELECT status FROM lease.renew('tl-2', 'h', 1, interval '1 s');
SELECT acquired, epoch FROM lease.acquire('tl-2', 'h', interval '1 s');
-- the same re-acquire with a wait: timeout, and the DETAIL names the grace
SELECT * FROM lease.acquire('tl-2', 'h', interval '1 s', wait => interval '0.05 s');
SELECT acquired, epoch FROM lease.acquire('tl-new', 'n', interval '1 s');
SELECT timeline, era, grace_until > clock_timestamp() AS in_grace,
       grace_until <= clock_timestamp() + interval '1 s' AS grace_at_most_max_ttl
  FROM lease.status();
SELECT status FROM lease.release('tl-1', 'h', 3);
SELECT acquired, epoch FROM lease.acquire('tl-1', 'n', interval '1 s');
-- a blocking acquire whose wait ends first times out, naming the grace
SELECT * FROM lease.acquire('tl-new', 'n', interval '1 s', wait => interval '0.1 s');
\echo :LAST_ERROR_SQLSTATE
-- one that waits longer gets the key when the grace ends, in the new era:
-- above 2^40, so above anything the old timeline could have handed out
-- (in a transaction begun during the grace: the grace is read on the clock)
BEGIN;
SELECT acquired, epoch, epoch = (1::bigint << 40) + 1 AS first_of_era_1
  FROM lease.acquire('tl-new', 'n', interval '1 s', wait => interval '3 s');
SELECT acquired, epoch FROM lease.acquire('tl-1', 'n', interval '1 s');
-- after the grace, an earlier-era grant that is still live (here written by
-- hand: renewed through the grace) is handed back to its holder as usual
INSERT INTO lease.leases (key, owner, epoch, expires_at, acquired_at, holder_role)
  VALUES ('tl-old', 'h', 3, clock_timestamp() + interval '1 hour', clock_timestamp(), session_user);
SELECT acquired, epoch FROM lease.acquire('tl-old', 'h', interval '1 s');
DELETE FROM lease.leases WHERE key = 'tl-old';
COMMIT;
SELECT pg_sleep(1.1);
SELECT acquired, epoch FROM lease.acquire('tl-2', 'n', interval '1 s');
SELECT timeline, era FROM lease.status();
-- a first grant under REPEATABLE READ (no floor re-read there) is in the era too
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT acquired, epoch = (1::bigint << 40) + 1 AS first_of_era_1 FROM lease.acquire('tl-rr', 'n', interval '1 s');
COMMIT;

-- The recorded timeline is newer than the server's (a dump restored into
-- another cluster): one more era, and a grace again.
UPDATE lease.timeline_state SET timeline = 5;
SELECT acquired FROM lease.acquire('tl-3', 'n', interval '1 s');
SELECT timeline, era, grace_until > clock_timestamp() AS in_grace FROM lease.status();
SELECT pg_sleep(1.1);
SELECT acquired, epoch, epoch = (2::bigint << 40) + 1 AS first_of_era_2
  FROM lease.acquire('tl-3', 'n', interval '1 s');
-- Two timelines at once (1 -> 2 -> 3 seen as 1 -> 3: the state of the grant
-- made on timeline 2 never replicated): the era grows by 2, so it cannot be
-- the era timeline 2 used. Simulated by recording timeline -1 (2 below 1).
UPDATE lease.timeline_state SET timeline = -1;
CHECKPOINT;
SELECT acquired FROM lease.acquire('tl-4', 'n', interval '1 s');
SELECT timeline, era FROM lease.status();

-- A timeline change seen by an acquire whose transaction rolls back is seen
-- again by the next one: the grace starts later (the safe direction).
SELECT pg_sleep(1.1);
UPDATE lease.timeline_state SET timeline = 0;
CHECKPOINT;
SELECT era AS era_before FROM lease.status() \gset
BEGIN;
SELECT acquired FROM lease.acquire('tl-5', 'n', interval '1 s');
SELECT era = :era_before + 1 AS moved FROM lease.status();
ROLLBACK;
SELECT timeline, era = :era_before AS unchanged FROM lease.status();
SELECT acquired FROM lease.acquire('tl-5', 'n', interval '1 s');
SELECT timeline, era = :era_before + 1 AS moved, grace_until > clock_timestamp() AS in_grace FROM lease.status();

-- Read-only: on a standby and in a read-only transaction every changing call
-- raises 25006 read_only at once; reads answer.
SELECT pg_sleep(1.1);
SET default_transaction_read_only = on;
SELECT * FROM lease.acquire('tl-ro', 'n', interval '1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('tl-ro', 'n', interval '1 s', wait => interval '10 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('tl-5', 'n', 1, interval '1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('tl-5', 'n', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('tl-5', 'n', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.force_release('tl-5');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.cleanup(interval '1 day');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.configure(max_ttl => interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT held FROM lease.inspect('tl-5');
SELECT count(*) > 0 AS listed FROM lease.list();
SELECT max_ttl FROM lease.status();
RESET default_transaction_read_only;
BEGIN READ ONLY;
SELECT * FROM lease.acquire('tl-ro', 'n', interval '1 s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM lease.unlisten('tl-ro');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- 0.4.0: the promotion mode. Invalid input changes nothing; 'synchronous'
-- imposes no grace (the operator states that only a standby with every
-- acknowledged commit can be promoted). Grants still held keep the previous
-- grace for its length (here other files' grants: dropped by hand, as if they
-- had ended; the Go tests check the quiet case). A promotion then moves to a
-- new era and grants at once.
DELETE FROM lease.leases WHERE key LIKE 'tl-%';
SELECT * FROM lease.configure(promotion => 'strict');
\echo :LAST_ERROR_SQLSTATE
SELECT configured_max_ttl, configured_promotion FROM lease.configure(max_ttl => interval '1 s', promotion => 'synchronous');
UPDATE lease.settings SET prev_max_ttl = NULL, prev_until = NULL;
SELECT max_ttl, promotion_grace, promotion FROM lease.status();
UPDATE lease.timeline_state SET timeline = 0;
SELECT acquired, epoch > (1::bigint << 40) AS new_era FROM lease.acquire('tl-sync', 'n', interval '1 s');
SELECT timeline = lease._timeline() AS recorded, grace_until <= clock_timestamp() AS no_grace FROM lease.status();
-- back to 'any': the grace is max_ttl again, at once (a longer grace is safe)
SELECT * FROM lease.configure(promotion => 'any');
DELETE FROM lease.leases WHERE key = 'tl-sync';

-- 0.4.0: the grace runs from when the new timeline began, not from the first
-- grant path after it. The promotion's checkpoint is made, then nothing calls
-- for 2 s: the grace ends by the checkpoint's start (whole seconds) + 1 s +
-- max_ttl, and no earlier than its recorded time + max_ttl; before 0.4.0 it
-- ended max_ttl after the first grant path.
DELETE FROM lease.settings;
INSERT INTO lease.settings (max_ttl) VALUES (interval '3 s');
UPDATE lease.timeline_state SET timeline = 0;
CHECKPOINT;
SELECT c.checkpoint_time AS ckpt, c.timeline_id = lease._timeline() AS on_server_timeline
  FROM pg_control_checkpoint() c \gset
\echo :on_server_timeline
SELECT pg_sleep(2);
SELECT acquired FROM lease.acquire('tl-began', 'n', interval '1 s');
SELECT grace_until <= :'ckpt'::timestamptz + interval '4 s' AS from_the_checkpoint,
       grace_until >= :'ckpt'::timestamptz + interval '3 s' AS at_least_max_ttl_after_it,
       grace_until < clock_timestamp() + interval '2 s' AS not_from_the_grant
  FROM lease.status();
DELETE FROM lease.leases WHERE key = 'tl-began';

DELETE FROM lease.settings;
DELETE FROM lease.leases WHERE key LIKE 'tl-%';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

-- A state row removed by hand is made again by the next grant path, its
-- grace measured from the clock at that grant, not from the start of the
-- statement that makes it (here a DO block that first sleeps 0.5 s).
DELETE FROM lease.timeline_state;
DO $$
DECLARE
  g timestamptz;
BEGIN
  PERFORM pg_sleep(0.5);
  PERFORM lease.acquire('tl-clock', 'c', interval '1 s');
  SELECT t.grace_until INTO g FROM lease.timeline_state t;
  IF g < statement_timestamp() + interval '0.4 s' + lease._grace() THEN
    RAISE EXCEPTION 'grace measured from the statement''s start';
  END IF;
END $$;
SELECT count(*) AS state_rows, min(era) AS era FROM lease.timeline_state;
DELETE FROM lease.leases WHERE key = 'tl-clock';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

-- A timeline change seen by a statement that began 0.5 s earlier, where the
-- control file proves no start of the timeline (here a recorded timeline
-- newer than the server's, as after a restore): the grace is measured from
-- the clock when the change is seen, not from the start of the statement or
-- of its transaction.
UPDATE lease.timeline_state SET timeline = 5;
DO $$
DECLARE
  g timestamptz;
BEGIN
  PERFORM pg_sleep(0.5);
  PERFORM lease.acquire('tl-clock2', 'c', interval '1 s');
  SELECT t.grace_until INTO g FROM lease.timeline_state t ORDER BY t.era DESC LIMIT 1;
  IF g < statement_timestamp() + interval '0.4 s' + lease._grace() THEN
    RAISE EXCEPTION 'grace measured from the statement''s start';
  END IF;
END $$;
DELETE FROM lease.leases WHERE key = 'tl-clock2';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

-- A state row removed by hand while a grant of era 1 is stored: the state
-- made again starts above every epoch stored (era 2), not at the era the
-- largest stored epoch belongs to (1) or below it.
INSERT INTO lease.leases (key, owner, epoch, expires_at, acquired_at)
  VALUES ('tl-era1', NULL, (1::bigint << 40) + 5, clock_timestamp(), clock_timestamp());
DELETE FROM lease.timeline_state;
SELECT acquired FROM lease.acquire('tl-era2', 'e', interval '1 s');  -- in the grace the new state starts
SELECT count(*) AS state_rows, min(era) AS era FROM lease.timeline_state;
DELETE FROM lease.leases WHERE key LIKE 'tl-era%';
DELETE FROM lease.timeline_state;
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

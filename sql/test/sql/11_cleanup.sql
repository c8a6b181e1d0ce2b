-- 11_cleanup (0.2.0): lease.cleanup removes keys free for long enough, never a
-- held key, and raises the epoch floor so that a removed key that comes back
-- gets an epoch above every epoch it had (I2, I3). Also the 0.1.0 -> 0.2.0
-- update path, and cleanup's privileges and invalid input.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The update path: install 0.1.0, use it, update, state kept.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT lease.version();
SELECT acquired, epoch FROM lease.acquire('cu-held', 'o1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('cu-free', 'o1', interval '1h');
SELECT status FROM lease.release('cu-free', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('cu-free', 'o1', interval '1h');
SELECT status FROM lease.release('cu-free', 'o1', 3);          -- counter 4
SELECT acquired, epoch FROM lease.acquire('cu-lapsed', 'o2', interval '3s');
ALTER EXTENSION pg_lease UPDATE;
SELECT lease.version();
SELECT key, held, owner, epoch FROM lease.list();
-- Until the server says cu-lapsed lapsed (its 3 s outlast a slow update).
DO $$ DECLARE d timestamptz := clock_timestamp() + interval '60 s'; BEGIN
  WHILE (SELECT held FROM lease.inspect('cu-lapsed')) AND clock_timestamp() < d LOOP PERFORM pg_sleep(0.05); END LOOP;
END $$;

-- Nothing has been free for an hour: nothing removed, floor 0.
SELECT * FROM lease.cleanup(interval '1h');
-- Free for at least 0 s: the free and the lapsed key go, the held one stays.
SELECT * FROM lease.cleanup(interval '0');
SELECT key, held, owner, epoch FROM lease.list();
-- Removed keys come back above every epoch they had; so does a new key.
SELECT acquired, epoch FROM lease.acquire('cu-free', 'o3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('cu-lapsed', 'o3', interval '1h');
SELECT acquired, epoch FROM lease.acquire('cu-new', 'o3', interval '1h');
-- A held key is never removed.
SELECT * FROM lease.cleanup(interval '0');
SELECT count(*) AS keys FROM lease.list();
-- max_rows bounds the work; the oldest free keys go first.
SELECT status FROM lease.release('cu-free', 'o3', 5);
SELECT pg_sleep(0.01);
SELECT status FROM lease.release('cu-new', 'o3', 5);
SELECT * FROM lease.cleanup(interval '0', 1);
SELECT key FROM lease.list() WHERE NOT held;

-- Invalid input: 22023 with every violation named, nothing removed.
SELECT * FROM lease.cleanup(NULL, 0);
SELECT * FROM lease.cleanup(interval '-1s', NULL);
SELECT count(*) AS keys FROM lease.list();

-- Operators only: EXECUTE is revoked from PUBLIC.
CREATE ROLE regress_pglease_cleaner LOGIN;
SET ROLE regress_pglease_cleaner;
SELECT * FROM lease.cleanup(interval '0');
SELECT * FROM lease.epoch_floor;
RESET ROLE;
DROP ROLE regress_pglease_cleaner;

-- The floor's row removed by hand: the floor reads 0 (a new key starts at 1),
-- and the next clean-up makes the row again.
DELETE FROM lease.epoch_floor;
SELECT acquired, epoch FROM lease.acquire('cu-nofloor', 'o4', interval '30s');
SELECT status FROM lease.release('cu-nofloor', 'o4', 1);
SELECT removed >= 1 AS removed_some, epoch_floor FROM lease.cleanup(interval '0');
SELECT count(*) AS floor_rows FROM lease.epoch_floor;
-- Removed by hand again, with nothing to clean: the floor reads 0 and its
-- row is made again with 0.
DELETE FROM lease.epoch_floor;
SELECT epoch_floor FROM lease.status();
SELECT removed, epoch_floor FROM lease.cleanup(interval '1 day');
SELECT * FROM lease.epoch_floor;

-- free_for's underflow bound is measured from the clock at the call: in a
-- transaction 0.6 s old, a free_for 1.3 s short of the start of the
-- timestamptz range is still valid (it frees nothing).
BEGIN;
SELECT pg_sleep(0.6);
SELECT removed FROM lease.cleanup((clock_timestamp() - timestamptz '4713-11-24 00:00:00+00 BC') - interval '1.3 s');
ROLLBACK;

-- upgrade_02_update: ALTER EXTENSION pg_lease UPDATE TO '0.2.0' on the
-- database that upgrade_01_install_0_1_0 left at 0.1.0 (upgrade_04 takes it on
-- to 0.3.0). Every row survives unchanged, the
-- grants made by 0.1.0 keep working with their epochs, the counters continue,
-- and what 0.2.0 adds works on the old rows. The database is left with those
-- rows (and no epoch floor) for the regression suite that runs after this.
\set VERBOSITY default
\set SHOW_CONTEXT never

ALTER EXTENSION pg_lease UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();

-- Every row exactly as before the update (all columns, timestamps included).
SELECT count(*) AS rows_before, (SELECT count(*) FROM lease.leases) AS rows_after FROM upgrade_before;
SELECT count(*) AS changed_rows FROM (
  (SELECT * FROM lease.leases EXCEPT ALL SELECT * FROM upgrade_before)
  UNION ALL
  (SELECT * FROM upgrade_before EXCEPT ALL SELECT * FROM lease.leases)) d;
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;
SELECT * FROM lease.epoch_floor;

-- Grants made by 0.1.0 renew, fence and release with their epochs.
SELECT status, expires_at > clock_timestamp() + interval '1h 59m' AS extended
  FROM lease.renew('up-held', 'h1', 1, interval '2h');
SELECT lease.fence('up-held3', 'h3', 3) > clock_timestamp() AS fenced;
SELECT status FROM lease.renew('up-held3', 'h3', 1, interval '1h');
SELECT status FROM lease.release('up-held3', 'h3', 3);
-- Holders whose 0.1.0 grants lapsed are told so (also the one a takeover
-- ended); the holder that took over renews.
SELECT status FROM lease.renew('up-lapsed', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up-taken', 'l1', 1, interval '1h');
SELECT status FROM lease.renew('up-taken', 't2', 2, interval '1h');
SELECT status FROM lease.renew('up-free', 'f1', 1, interval '1h');

-- Counters continue where 0.1.0 left them; a never-leased key starts at 1.
SELECT acquired, epoch FROM lease.acquire('up-lapsed', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-free', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-busy', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-held3', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-forced', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-new', 'n1', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-held', 'n1', interval '1h');
SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;

-- lease.cleanup (new in 0.2.0) on rows 0.1.0 wrote: keys freed come back
-- above every epoch they had. In a transaction that is rolled back, so that
-- the epoch floor stays 0 for the regression suite that runs next in this
-- database (its first grants expect epoch 1).
BEGIN;
SELECT status FROM lease.release('up-busy', 'n1', 11);
SELECT status FROM lease.release('up-forced', 'n1', 3);
SELECT * FROM lease.cleanup(interval '0');
SELECT key FROM lease.list() ORDER BY key;
SELECT acquired, epoch FROM lease.acquire('up-forced', 'n2', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-busy', 'n2', interval '1h');
SELECT acquired, epoch FROM lease.acquire('up-other-new', 'n2', interval '1h');
ROLLBACK;
SELECT * FROM lease.epoch_floor;


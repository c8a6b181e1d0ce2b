-- 01_acquire: lease.acquire from every starting state of the SPEC-NOTES
-- transition table, the epoch rules, blocking acquires (success, timeout) and
-- the isolation-level rule for blocking acquires.
-- Time-dependent values are projected to booleans.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- never leased -> HELD by o, epoch 1, expires_at = server now + ttl
SELECT acquired, epoch,
       expires_at >  clock_timestamp() + interval '29s' AS expiry_after_now_plus_29s,
       expires_at <= clock_timestamp() + interval '30s' AS expiry_within_now_plus_30s
  FROM lease.acquire('acq-1', 'o1', interval '30s');

-- HELD by o -> idempotent: acquired, same epoch, expiry unchanged (even with
-- another ttl, and after time has passed)
SELECT epoch AS e1, extract(epoch FROM expires_at) AS x1 FROM lease.inspect('acq-1') \gset
SELECT pg_sleep(0.05);
SELECT acquired, epoch = :e1 AS same_epoch,
       extract(epoch FROM expires_at) = :x1 AS same_expiry
  FROM lease.acquire('acq-1', 'o1', interval '60s');
SELECT acquired, epoch = :e1 AS same_epoch,
       extract(epoch FROM expires_at) = :x1 AS same_expiry
  FROM lease.acquire('acq-1', 'o1', interval '30s', interval '1s');

-- HELD by another owner -> denied with NULL epoch and expiry; nothing changes
SELECT acquired, epoch, expires_at FROM lease.acquire('acq-1', 'o2', interval '30s');
SELECT held, owner, epoch = :e1 AS same_epoch,
       extract(epoch FROM expires_at) = :x1 AS same_expiry
  FROM lease.inspect('acq-1');

-- LAPSED (epoch 1) -> takeover by another owner, epoch 2, expiry from now
-- (the worked sequence: lapse-then-takeover after epoch 1 gives epoch 2)
SELECT acquired, epoch FROM lease.acquire('acq-2', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT held, owner, epoch, expires_at FROM lease.inspect('acq-2');
SELECT acquired, epoch,
       expires_at > clock_timestamp() + interval '29s' AS expiry_from_now
  FROM lease.acquire('acq-2', 'o2', interval '30s');

-- LAPSED by o itself -> o's acquire is a new grant (epoch + 1), not idempotent
SELECT acquired, epoch FROM lease.acquire('acq-3', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT acquired, epoch,
       expires_at > clock_timestamp() + interval '29s' AS expiry_from_now
  FROM lease.acquire('acq-3', 'o1', interval '30s');

-- FREE (counter E) -> HELD with epoch E + 1. The worked sequence: acquire -> 1,
-- release -> counter 2, acquire -> 3; any owner, the former holder included.
SELECT acquired, epoch FROM lease.acquire('acq-4', 'o1', interval '30s');
SELECT status FROM lease.release('acq-4', 'o1', 1);
SELECT held, owner, epoch, expires_at FROM lease.inspect('acq-4');
SELECT acquired, epoch FROM lease.acquire('acq-4', 'o2', interval '30s');
SELECT status FROM lease.release('acq-4', 'o2', 3);
SELECT acquired, epoch FROM lease.acquire('acq-4', 'o2', interval '30s');

-- wait given as 0 (explicitly or by default) is a non-blocking acquire
SELECT acquired, epoch FROM lease.acquire('acq-1', 'o2', interval '30s', interval '0');
SELECT acquired, epoch FROM lease.acquire(key => 'acq-1', owner => 'o2', ttl => interval '30s');

-- Blocking acquire on a key held for longer than the wait: after the wait it
-- raises timeout (57014), distinguishable from a denial. Nothing changes.
SELECT extract(epoch FROM clock_timestamp()) AS t0 \gset
SELECT * FROM lease.acquire('acq-1', 'o2', interval '30s', interval '0.2s');
\echo :LAST_ERROR_SQLSTATE
SELECT extract(epoch FROM clock_timestamp()) - :t0 >= 0.2 AS waited_the_whole_wait;
SELECT held, owner, epoch FROM lease.inspect('acq-1');

-- Blocking acquire on a key that lapses during the wait: it takes the key over
-- at the holder's expiry, with the next epoch.
SELECT acquired, epoch FROM lease.acquire('acq-5', 'o1', interval '0.3s');
SELECT extract(epoch FROM clock_timestamp()) AS t0 \gset
SELECT acquired, epoch,
       expires_at > clock_timestamp() + interval '29s' AS expiry_from_now
  FROM lease.acquire('acq-5', 'o2', interval '30s', interval '5s');
SELECT extract(epoch FROM clock_timestamp()) - :t0 BETWEEN 0.1 AND 2 AS woke_at_expiry;

-- Blocking acquire of a free or never-leased key returns at once.
SELECT acquired, epoch FROM lease.acquire('acq-6', 'o1', interval '30s', interval '5s');

-- A blocking acquire (wait > 0) needs READ COMMITTED: under REPEATABLE READ
-- and SERIALIZABLE it raises invalid_isolation (25000) whatever the key's
-- state, and changes nothing; a non-blocking acquire (wait = 0) works there.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM lease.acquire('acq-7', 'o1', interval '30s', interval '0.2s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT * FROM lease.acquire('acq-7', 'o1', interval '30s', interval '1s');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS rows_for_acq_7 FROM lease.inspect('acq-7');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT acquired, epoch FROM lease.acquire('acq-7', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('acq-7', 'o1', interval '30s', interval '0');
SELECT acquired, epoch FROM lease.acquire('acq-1', 'o2', interval '30s');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT acquired, epoch FROM lease.acquire('acq-8', 'o1', interval '30s');
COMMIT;
SELECT held, owner, epoch FROM lease.inspect('acq-7');

-- TTL is a number of seconds (extract(epoch FROM ttl)): a month counts 30
-- days, a year 365.25 days (so '12 mons', which PostgreSQL stores as one
-- year, is 365.25 days, not 360) and a day 24 hours, whatever the session's
-- time zone (America/New_York has 23- and 25-hour days). (0.3.0: ttls above
-- an hour need a higher max_ttl; the row of lease.settings is removed after.)
SELECT configured_max_ttl FROM lease.configure(max_ttl => interval '2 years');
SET TimeZone = 'America/New_York';
SELECT acquired, epoch FROM lease.acquire('acq-9', 'o1', interval '1 mon');
SELECT acquired, epoch FROM lease.acquire('acq-10', 'o1', interval '1 day');
SELECT acquired, epoch FROM lease.acquire('acq-11', 'o1', interval '1 mon 1 day 1 hour 0.5 s');
SELECT acquired, epoch FROM lease.acquire('acq-13', 'o1', interval '12 mons');
SELECT acquired, epoch FROM lease.acquire('acq-14', 'o1', interval '13 mons');
SELECT key, extract(epoch FROM expires_at) - extract(epoch FROM acquired_at) AS ttl_seconds
  FROM lease.list() WHERE key IN ('acq-9', 'acq-10', 'acq-11', 'acq-13', 'acq-14') ORDER BY key;
RESET TimeZone;
DELETE FROM lease.settings;
-- a fraction of a second is a valid ttl
SELECT acquired, epoch,
       expires_at <= clock_timestamp() + interval '0.5s' AS expiry_within_half_second
  FROM lease.acquire('acq-12', 'o1', interval '0.5s');

-- Distinct keys never interact: all the above left acq-1 as it was.
SELECT held, owner, epoch = :e1 AS same_epoch,
       extract(epoch FROM expires_at) = :x1 AS same_expiry
  FROM lease.inspect('acq-1');

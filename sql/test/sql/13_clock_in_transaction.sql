-- 13_clock_in_transaction: inside one client transaction, every call reads
-- the server clock at the call (clock_timestamp()), not the transaction's
-- start (now()): a grant made in the transaction lapses in it, and inspect,
-- list, renew, release, fence and acquire all see the lapse; expiries set
-- late in a transaction count from the clock. (The blocking acquire's loop,
-- where now() would also be frozen, is 01_acquire's acq-5.)
\set VERBOSITY default
\set SHOW_CONTEXT never

-- clk-1: a grant made in the transaction, lapsed 0.5 s later in the same one
BEGIN;
SELECT acquired, epoch FROM lease.acquire('clk-1', 'a', interval '0.3s');
SELECT pg_sleep(0.5);
SELECT clock_timestamp() - now() > interval '0.4s' AS transaction_started_earlier;
SELECT held, owner, epoch, expires_at FROM lease.inspect('clk-1');
SELECT key, held, owner FROM lease.list() WHERE key = 'clk-1';
SELECT status, expires_at FROM lease.renew('clk-1', 'a', 1, interval '30s');
SELECT status FROM lease.release('clk-1', 'a', 1);
-- the lapsed holder's own acquire is a new grant (epoch 2), not the old one
SELECT acquired, epoch, expires_at > clock_timestamp() + interval '29s' AS expiry_from_clock
  FROM lease.acquire('clk-1', 'a', interval '30s');
COMMIT;
SELECT held, owner, epoch FROM lease.inspect('clk-1');

-- clk-2: another owner takes over a grant that lapsed during its transaction
SELECT acquired, epoch FROM lease.acquire('clk-2', 'a', interval '0.3s');
BEGIN;
SELECT pg_sleep(0.5);
SELECT acquired, epoch, expires_at > clock_timestamp() + interval '29s' AS expiry_from_clock
  FROM lease.acquire('clk-2', 'b', interval '30s');
COMMIT;

-- clk-3: a first grant, a renewal and a release late in a transaction
BEGIN;
SELECT pg_sleep(0.5);
SELECT acquired, epoch, expires_at > clock_timestamp() + interval '29s' AS expiry_from_clock
  FROM lease.acquire('clk-3', 'a', interval '30s');
SELECT pg_sleep(0.5);
SELECT status, expires_at > clock_timestamp() + interval '29s' AS expiry_from_clock
  FROM lease.renew('clk-3', 'a', 1, interval '30s');
SELECT status FROM lease.release('clk-3', 'a', 1);
SELECT held, epoch, expires_at FROM lease.inspect('clk-3');
-- the release time recorded is the clock's too: 1 s after the transaction began
SELECT expires_at >= now() + interval '1s' AS release_time_from_clock
  FROM lease.leases WHERE key = 'clk-3';
COMMIT;

-- clk-4: fence inside the transaction after the grant lapsed: 55000 lapsed
BEGIN;
SELECT acquired, epoch FROM lease.acquire('clk-4', 'a', interval '0.3s');
SELECT pg_sleep(0.5);
SELECT lease.fence('clk-4', 'a', 1) IS NOT NULL AS fenced;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

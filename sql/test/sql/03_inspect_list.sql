-- 03_inspect_list: lease.inspect and lease.list report the lazy-expiry state
-- (held, free, lapsed, never leased) and never change anything.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- Expiries are checked between exact bounds: the clock before the grant
-- + 30 s and the clock at the check + 30 s (no guess of elapsed time).
SELECT clock_timestamp() AS before_held \gset
SELECT acquired, epoch FROM lease.acquire('insp-held', 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('insp-free', 'o1', interval '30s');
SELECT status FROM lease.release('insp-free', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('insp-lapsed', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);

-- HELD: held=t, owner, epoch, expires_at
SELECT held, owner, epoch,
       expires_at BETWEEN :'before_held'::timestamptz + interval '30s'
                      AND clock_timestamp() + interval '30s' AS expiry_in_30s
  FROM lease.inspect('insp-held');
-- FREE: held=f, no owner, epoch = the counter (released epoch + 1), no expiry
SELECT held, owner, epoch, expires_at FROM lease.inspect('insp-free');
-- LAPSED: reported as unowned, epoch = the lapsed grant's epoch, no expiry
SELECT held, owner, epoch, expires_at FROM lease.inspect('insp-lapsed');
-- never leased: zero rows (distinct from a released key's one row)
SELECT held, owner, epoch, expires_at FROM lease.inspect('insp-never');

-- inspect changes nothing: the lapsed row still names its former holder (lazy
-- expiry), which is still told lapsed; no row was created for insp-never.
SELECT owner, epoch FROM lease.leases WHERE key = 'insp-lapsed';
SELECT count(*) AS rows_for_insp_never FROM lease.leases WHERE key = 'insp-never';
SELECT status FROM lease.renew('insp-lapsed', 'o1', 1, interval '30s');

-- A held lease becomes reported as lapsed exactly when server time passes
-- its expiry, without any writer.
SELECT acquired, epoch FROM lease.acquire('insp-soon', 'o1', interval '0.3s');
SELECT held, owner, epoch FROM lease.inspect('insp-soon');
SELECT pg_sleep(0.4);
SELECT held, owner, epoch FROM lease.inspect('insp-soon');

-- list: every key with the same reporting as inspect, plus acquired_at
-- (NULL unless held), in ascending key order
SELECT key, held, owner, epoch,
       acquired_at <= clock_timestamp() AS acquired_in_past,
       expires_at BETWEEN :'before_held'::timestamptz + interval '30s'
                      AND clock_timestamp() + interval '30s' AS expiry_in_30s
  FROM lease.list() WHERE key LIKE 'insp-%';
SELECT (SELECT array_agg(key) FROM lease.list())
       = (SELECT array_agg(key ORDER BY key) FROM lease.leases) AS list_sorted_and_complete;
SELECT l.key, l.held, l.owner, l.epoch, l.expires_at
  FROM lease.list() l, lease.inspect(l.key) i
 WHERE (l.held, l.owner, l.epoch, l.expires_at)
       IS DISTINCT FROM (i.held, i.owner, i.epoch, i.expires_at);

-- 02_renew_release: lease.renew and lease.release from every state, every
-- status (ok, not_owner, lapsed, epoch_mismatch) and their precedence
-- (not_owner, then lapsed, then epoch_mismatch); failed calls change nothing.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- Fingerprint of the whole state, to show that a call changed nothing.
CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;

-- renew of the current grant: ok, expires_at = server now + ttl, epoch unchanged
SELECT acquired, epoch FROM lease.acquire('rr-1', 'o1', interval '10s');
SELECT status,
       expires_at >  clock_timestamp() + interval '59s' AS expiry_after_now_plus_59s,
       expires_at <= clock_timestamp() + interval '60s' AS expiry_within_now_plus_60s
  FROM lease.renew('rr-1', 'o1', 1, interval '60s');
SELECT held, owner, epoch, expires_at > clock_timestamp() + interval '59s' AS renewed
  FROM lease.inspect('rr-1');
-- the new expiry is now + ttl even when that is sooner than the old one
SELECT status, expires_at <= clock_timestamp() + interval '5s' AS shortened
  FROM lease.renew('rr-1', 'o1', 1, interval '5s');
SELECT held, owner, epoch FROM lease.inspect('rr-1');

-- Every failing status leaves the state unchanged and returns no expiry.
SELECT pg_temp.state() AS s0 \gset
-- not_owner: never-leased key
SELECT status, expires_at FROM lease.renew('rr-none', 'o1', 1, interval '30s');
SELECT status FROM lease.release('rr-none', 'o1', 1);
SELECT count(*) AS rows_for_rr_none FROM lease.inspect('rr-none');
-- not_owner: another owner, with the right or a wrong epoch (not_owner comes
-- before epoch_mismatch)
SELECT status, expires_at FROM lease.renew('rr-1', 'o2', 1, interval '30s');
SELECT status, expires_at FROM lease.renew('rr-1', 'o2', 7, interval '30s');
SELECT status FROM lease.release('rr-1', 'o2', 1);
SELECT status FROM lease.release('rr-1', 'o2', 7);
-- epoch_mismatch: the holder with a stale or a future epoch
SELECT status, expires_at FROM lease.renew('rr-1', 'o1', 2, interval '30s');
SELECT status FROM lease.release('rr-1', 'o1', 2);
SELECT pg_temp.state() = :'s0' AS unchanged;

-- lapsed: the caller held the key and its grant expired (no takeover yet).
-- lapsed comes before epoch_mismatch.
SELECT acquired, epoch FROM lease.acquire('rr-2', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT pg_temp.state() AS s0 \gset
SELECT status, expires_at FROM lease.renew('rr-2', 'o1', 1, interval '30s');
SELECT status, expires_at FROM lease.renew('rr-2', 'o1', 5, interval '30s');
SELECT status FROM lease.release('rr-2', 'o1', 1);
SELECT status FROM lease.release('rr-2', 'o1', 5);
-- another owner of a lapsed grant: not_owner
SELECT status FROM lease.renew('rr-2', 'o2', 1, interval '30s');
SELECT status FROM lease.release('rr-2', 'o2', 1);
SELECT pg_temp.state() = :'s0' AS unchanged;
-- a lapsed release does not free the key nor move the epoch: the takeover
-- gets epoch 2
SELECT held, owner, epoch FROM lease.inspect('rr-2');
SELECT acquired, epoch FROM lease.acquire('rr-2', 'o2', interval '30s');

-- lapsed after a takeover: the former holder presenting its epoch is told
-- lapsed (seed example 3); with any other epoch it is not_owner. The new
-- holder is unaffected.
SELECT pg_temp.state() AS s0 \gset
SELECT status, expires_at FROM lease.renew('rr-2', 'o1', 1, interval '30s');
SELECT status FROM lease.release('rr-2', 'o1', 1);
SELECT status FROM lease.renew('rr-2', 'o1', 2, interval '30s');
SELECT status FROM lease.renew('rr-2', 'o1', 3, interval '30s');
SELECT pg_temp.state() = :'s0' AS unchanged;
SELECT status FROM lease.renew('rr-2', 'o2', 2, interval '30s');
-- the row remembers only the grant that the last takeover ended: once the
-- key has been released and granted again, the old holder is not_owner
SELECT status FROM lease.release('rr-2', 'o2', 2);
SELECT status FROM lease.renew('rr-2', 'o1', 1, interval '30s');
SELECT acquired, epoch FROM lease.acquire('rr-2', 'o3', interval '30s');
SELECT status FROM lease.renew('rr-2', 'o1', 1, interval '30s');

-- The former holder that took its own lapsed grant over (epoch 2) and still
-- presents epoch 1 gets epoch_mismatch.
SELECT acquired, epoch FROM lease.acquire('rr-3', 'o1', interval '0.2s');
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('rr-3', 'o1', interval '30s');
SELECT status FROM lease.renew('rr-3', 'o1', 1, interval '30s');
SELECT status FROM lease.release('rr-3', 'o1', 1);
SELECT status FROM lease.renew('rr-3', 'o1', 2, interval '30s');

-- release: ok, the key becomes FREE and its counter is the released epoch + 1
SELECT acquired, epoch FROM lease.acquire('rr-4', 'o1', interval '30s');
SELECT status FROM lease.release('rr-4', 'o1', 1);
SELECT held, owner, epoch, expires_at FROM lease.inspect('rr-4');
-- not_owner on a FREE key, the former holder included, with any epoch
SELECT pg_temp.state() AS s0 \gset
SELECT status, expires_at FROM lease.renew('rr-4', 'o1', 1, interval '30s');
SELECT status, expires_at FROM lease.renew('rr-4', 'o1', 2, interval '30s');
SELECT status FROM lease.release('rr-4', 'o1', 1);
SELECT status FROM lease.release('rr-4', 'o1', 2);
SELECT pg_temp.state() = :'s0' AS unchanged;
SELECT held, owner, epoch FROM lease.inspect('rr-4');

-- renew never changes the epoch; release increments it once per grant
SELECT acquired, epoch FROM lease.acquire('rr-5', 'o1', interval '30s');
SELECT status FROM lease.renew('rr-5', 'o1', 1, interval '30s');
SELECT status FROM lease.renew('rr-5', 'o1', 1, interval '30s');
SELECT held, owner, epoch FROM lease.inspect('rr-5');
SELECT status FROM lease.release('rr-5', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('rr-5', 'o1', interval '30s');
SELECT status FROM lease.release('rr-5', 'o1', 3);
SELECT held, owner, epoch FROM lease.inspect('rr-5');

-- 90_renew_one_reading (0.5.0): a renewal decides and sets its expiry at one
-- reading of the clock, and a release decides and records its time at one
-- (specs/SEMANTICS.md, section 3). renew's one-statement
-- common case read the clock twice: in the row read that takes the lock (the
-- grant unexpired) and again for the new expiry. When the grant's expiry
-- fell between the two readings, renew answered ok with an expiry of a
-- reading after the grant had lapsed: ok for a lapsed grant, by its own
-- answer. Here the grant's expiry is set by hand to land a few microseconds
-- after the call, over a spread of offsets (0 to 5 ms, 5000 renewals in one
-- transaction), and every ok renewal's new expiry - ttl (its reading) must be
-- before the expiry it renewed. (Found by the randomized robustness test:
-- renew ok 0.29 ms after the grant's expiry.)
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('ror-1', 'o', interval '10 s');
DO $$
DECLARE
  v_prev   timestamptz;
  v_status text;
  v_exp    timestamptz;
  v_ok     int := 0;
  v_lapsed int := 0;
  v_bad    int := 0;
BEGIN
  FOR i IN 0 .. 4999 LOOP
    UPDATE lease.leases SET expires_at = clock_timestamp() + make_interval(secs => i * 0.000001)
     WHERE key = 'ror-1'
    RETURNING expires_at INTO v_prev;
    SELECT r.status, r.expires_at INTO v_status, v_exp FROM lease.renew('ror-1', 'o', 1, interval '10 s') r;
    IF v_status = 'ok' THEN
      v_ok := v_ok + 1;
      IF v_exp - interval '10 s' >= v_prev THEN
        v_bad := v_bad + 1;
      END IF;
    ELSIF v_status = 'lapsed' THEN
      v_lapsed := v_lapsed + 1;
    END IF;
  END LOOP;
  RAISE NOTICE 'ok renewals: %, lapsed: %, ok renewals read after the expiry they renewed: %',
    CASE WHEN v_ok > 0 THEN 'some' ELSE 'none' END, CASE WHEN v_lapsed > 0 THEN 'some' ELSE 'none' END, v_bad;
END
$$;
-- The grant live again (set by hand), the holder releases it.
UPDATE lease.leases SET expires_at = clock_timestamp() + interval '10 s' WHERE key = 'ror-1';
SELECT status FROM lease.release('ror-1', 'o', 1);

-- Release: its one-statement case read the clock to find the grant
-- unexpired and again for the time it records (the row's expires_at, the
-- history's 'released'): ok, and released after the grant's expiry. Each
-- release's recorded time must be before the expiry it ended.
SELECT acquired, epoch FROM lease.acquire('ror-2', 'o', interval '10 s');
DO $$
DECLARE
  v_prev   timestamptz;
  v_status text;
  v_at     timestamptz;
  v_ok     int := 0;
  v_lapsed int := 0;
  v_bad    int := 0;
BEGIN
  FOR i IN 0 .. 4999 LOOP
    UPDATE lease.leases SET owner = 'o', epoch = 1, holder_role = session_user,
                            expires_at = clock_timestamp() + make_interval(secs => i * 0.000001)
     WHERE key = 'ror-2'
    RETURNING expires_at INTO v_prev;
    v_status := lease.release('ror-2', 'o', 1);
    IF v_status = 'ok' THEN
      v_ok := v_ok + 1;
      SELECT l.expires_at INTO v_at FROM lease.leases l WHERE l.key = 'ror-2';
      IF v_at >= v_prev THEN
        v_bad := v_bad + 1;
      END IF;
    ELSIF v_status = 'lapsed' THEN
      v_lapsed := v_lapsed + 1;
    END IF;
  END LOOP;
  RAISE NOTICE 'ok releases: %, lapsed: %, ok releases recorded after the expiry they ended: %',
    CASE WHEN v_ok > 0 THEN 'some' ELSE 'none' END, CASE WHEN v_lapsed > 0 THEN 'some' ELSE 'none' END, v_bad;
END
$$;

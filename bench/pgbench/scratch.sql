-- Timing variants of lease.renew, for finding where its time goes. Loaded
-- into the benchmark database only (schema scratch), never shipped: each one
-- drops a guarantee or a check of the real function on purpose.
--   nosubtx   no BEGIN ... EXCEPTION block (a failed renew would keep its row lock)
--   nosp      no SET search_path clause (search_path no longer pinned)
--   noval     no input validation (_raise_invalid and the *_violation helpers)
--   nonotify  no pg_notify (durability forcing kept)
--   min       all four removed (durability forcing kept)
CREATE SCHEMA IF NOT EXISTS scratch;

CREATE OR REPLACE FUNCTION scratch._changed_nonotify(event text, key text, owner text, epoch bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF current_setting('synchronous_commit') = 'off' THEN
    PERFORM set_config('synchronous_commit', 'local', true);
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION scratch.renew_nosubtx(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_now timestamptz;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key), lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch), lease._duration_violation('ttl', ttl, true)]);
  v_ttl := lease._seconds(ttl);
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
    FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
  v_now := clock_timestamp();
  status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, v_owner, v_epoch, v_now);
  IF status <> 'ok' THEN
    expires_at := NULL;
    RETURN;
  END IF;
  UPDATE lease.leases l SET expires_at = v_now + v_ttl WHERE l.key = v_key RETURNING l.expires_at INTO expires_at;
  PERFORM lease._changed('renewed', v_key, v_owner, v_epoch);
END
$$;

CREATE OR REPLACE FUNCTION scratch.renew_nosp(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_now timestamptz;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key), lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch), lease._duration_violation('ttl', ttl, true)]);
  v_ttl := lease._seconds(ttl);
  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, v_owner, v_epoch, v_now);
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET expires_at = v_now + v_ttl WHERE l.key = v_key RETURNING l.expires_at INTO expires_at;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    expires_at := NULL;
    RETURN;
  END;
  PERFORM lease._changed('renewed', v_key, v_owner, v_epoch);
END
$$;

CREATE OR REPLACE FUNCTION scratch.renew_noval(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_now timestamptz;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  v_ttl := lease._seconds(ttl);
  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, v_owner, v_epoch, v_now);
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET expires_at = v_now + v_ttl WHERE l.key = v_key RETURNING l.expires_at INTO expires_at;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    expires_at := NULL;
    RETURN;
  END;
  PERFORM lease._changed('renewed', v_key, v_owner, v_epoch);
END
$$;

CREATE OR REPLACE FUNCTION scratch.renew_nonotify(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_now timestamptz;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key), lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch), lease._duration_violation('ttl', ttl, true)]);
  v_ttl := lease._seconds(ttl);
  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, v_owner, v_epoch, v_now);
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET expires_at = v_now + v_ttl WHERE l.key = v_key RETURNING l.expires_at INTO expires_at;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    expires_at := NULL;
    RETURN;
  END;
  PERFORM scratch._changed_nonotify('renewed', v_key, v_owner, v_epoch);
END
$$;

CREATE OR REPLACE FUNCTION scratch.renew_min(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_now timestamptz;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
    FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
  v_now := clock_timestamp();
  status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, v_owner, v_epoch, v_now);
  IF status <> 'ok' THEN
    expires_at := NULL;
    RETURN;
  END IF;
  UPDATE lease.leases l SET expires_at = v_now + lease._seconds(ttl) WHERE l.key = v_key RETURNING l.expires_at INTO expires_at;
  PERFORM scratch._changed_nonotify('renewed', v_key, v_owner, v_epoch);
END
$$;

-- oneupdate: a candidate restructuring that keeps the guarantees (a sketch
-- for the lead to judge, not shipped). The renewal is one UPDATE whose WHERE
-- clause is the holder check, read with clock_timestamp() inside the
-- statement, so it is re-evaluated on the locked row version if the UPDATE
-- had to wait (EvalPlanQual); an UPDATE keeps a row lock only on a row it
-- changes, so a failed renew keeps no lock without a subtransaction.
-- Validation runs the helpers only when a cheap test says something is
-- wrong; a failed renew classifies its status with an unlocked read (the
-- same _holder_status precedence). Durability forcing and NOTIFY are kept
-- (lease._changed), and search_path stays pinned.
CREATE OR REPLACE FUNCTION scratch.renew_oneupdate(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_secs double precision;
  r_owner text; r_epoch bigint; r_expires timestamptz; r_lowner text; r_lepoch bigint;
BEGIN
  v_secs := extract(epoch FROM ttl);
  IF v_key IS NULL OR v_key = '' OR octet_length(v_key) > 1024
     OR v_owner IS NULL OR v_owner = '' OR octet_length(v_owner) > 1024
     OR v_epoch IS NULL OR v_epoch < 1
     OR v_secs IS NULL OR v_secs <= 0 OR NOT isfinite(ttl) OR v_secs > 1e10 THEN
    PERFORM lease._raise_invalid(ARRAY[
      lease._text_violation('key', v_key), lease._text_violation('owner', v_owner),
      lease._epoch_violation(v_epoch), lease._duration_violation('ttl', ttl, true)]);
  END IF;
  UPDATE lease.leases l SET expires_at = clock_timestamp() + make_interval(secs => v_secs)
   WHERE l.key = v_key AND l.owner = v_owner AND l.epoch = v_epoch AND l.expires_at > clock_timestamp()
  RETURNING l.expires_at INTO expires_at;
  IF FOUND THEN
    status := 'ok';
    PERFORM lease._changed('renewed', v_key, v_owner, v_epoch);
    RETURN;
  END IF;
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
    FROM lease.leases l WHERE l.key = v_key;
  status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                 v_owner, v_epoch, clock_timestamp());
  IF status = 'ok' THEN
    status := 'lapsed';  -- it was not renewable when the UPDATE looked; never report ok without renewing
  END IF;
END
$$;

-- Floors of any pure-SQL renewal, beside the bare UPDATE (r_bare).
-- empty_plain: the call of a PL/pgSQL function that does nothing.
CREATE OR REPLACE FUNCTION scratch.empty_plain()
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
END
$$;

-- empty_definer: the same with lease.renew's arguments, result and
-- attributes (SECURITY DEFINER, pinned search_path), doing nothing.
CREATE OR REPLACE FUNCTION scratch.empty_definer(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  status := 'ok';
END
$$;

-- update_definer: r_bare's conditional UPDATE of bench.bare, and nothing
-- else, inside such a function.
CREATE OR REPLACE FUNCTION scratch.update_definer(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch;
BEGIN
  UPDATE bench.bare b SET expires_at = clock_timestamp() + ttl
   WHERE b.key = v_key AND b.owner = v_owner AND b.epoch = v_epoch AND b.expires_at > clock_timestamp()
  RETURNING b.expires_at INTO expires_at;
  status := CASE WHEN FOUND THEN 'ok' ELSE 'not_owner' END;
END
$$;

-- Variants of 0.5.0's renew fast path (r5_*): each is the fast path alone
-- (no full way: these keys are always renewable; any other answer raises),
-- differing in one part.
--   r5_copy      the fast path before the TID scan: an UPDATE that finds the
--                row by key (a second index scan) whose WHERE is a subquery
--                locking it FOR NO KEY UPDATE SKIP LOCKED
--   r5_ctid      r5_copy finding the locked row by its ctid (as shipped)
--   r5_one       one UPDATE with the same quals, no separate row lock. Not
--                safe: an UPDATE that waited for a concurrent change locks
--                the row's latest version before rechecking its quals, and
--                keeps that lock when they fail (another role's grant, a
--                free key), until the transaction ends
--   r5_onesub    r5_one inside BEGIN ... EXCEPTION (a subtransaction, whose
--                rollback drops such a lock)
--   r5_noset     r5_copy without the settings read in RETURNING
--   r5_notl      r5_copy without the life / timeline quals
--   r5_noplan    r5_copy without SET plan_cache_mode
CREATE OR REPLACE FUNCTION scratch.r5_copy(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = (SELECT x.key FROM lease.leases x
                     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
                       AND x.expires_at > clock_timestamp()
                       AND x.life = pg_catalog.pg_postmaster_start_time() AND x.life_timeline = lease._timeline()
                       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
                       FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
      INTO expires_at, v_max;
    IF FOUND THEN
      IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
        PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_one(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = v_key AND l.owner = v_owner AND l.epoch = v_epoch
       AND l.expires_at > clock_timestamp()
       AND l.life = pg_catalog.pg_postmaster_start_time() AND l.life_timeline = lease._timeline()
       AND (l.holder_role IS NULL OR l.holder_role = session_user::text OR lease._may_act(l.holder_role))
    RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
      INTO expires_at, v_max;
    IF FOUND THEN
      IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
        PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_onesub(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    BEGIN
      UPDATE lease.leases l SET expires_at = v_now + v_ttl
       WHERE l.key = v_key AND l.owner = v_owner AND l.epoch = v_epoch
         AND l.expires_at > clock_timestamp()
         AND l.life = pg_catalog.pg_postmaster_start_time() AND l.life_timeline = lease._timeline()
         AND (l.holder_role IS NULL OR l.holder_role = session_user::text OR lease._may_act(l.holder_role))
      RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
        INTO expires_at, v_max;
      IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'LEASE';
      END IF;
    EXCEPTION WHEN SQLSTATE 'LEASE' THEN
      RAISE EXCEPTION 'r5 variant: not renewed';
    END;
    IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
      PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
      PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    status := 'ok';
    RETURN;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_noset(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = (SELECT x.key FROM lease.leases x
                     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
                       AND x.expires_at > clock_timestamp()
                       AND x.life = pg_catalog.pg_postmaster_start_time() AND x.life_timeline = lease._timeline()
                       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
                       FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.expires_at INTO expires_at;
    IF FOUND THEN
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_notl(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = (SELECT x.key FROM lease.leases x
                     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
                       AND x.expires_at > clock_timestamp()
                       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
                       FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
      INTO expires_at, v_max;
    IF FOUND THEN
      IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
        PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_noplan(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = (SELECT x.key FROM lease.leases x
                     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
                       AND x.expires_at > clock_timestamp()
                       AND x.life = pg_catalog.pg_postmaster_start_time() AND x.life_timeline = lease._timeline()
                       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
                       FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
      INTO expires_at, v_max;
    IF FOUND THEN
      IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
        PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;

CREATE OR REPLACE FUNCTION scratch.r5_ctid(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key text := key; v_owner text := owner; v_epoch bigint := epoch; v_ttl interval; v_max interval; v_now timestamptz;
BEGIN
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    v_now := clock_timestamp();
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.ctid = (SELECT x.ctid FROM lease.leases x
                     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
                       AND x.expires_at > clock_timestamp()
                       AND x.life = pg_catalog.pg_postmaster_start_time() AND x.life_timeline = lease._timeline()
                       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
                       FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s)
      INTO expires_at, v_max;
    IF FOUND THEN
      IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
        PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'r5 variant: not renewed';
END
$$;


-- pg_lease 0.1.0: time-bounded ownership of named resources, kept in
-- PostgreSQL, that lapses unless renewed and carries a monotonic fencing epoch.
--
-- Pure SQL and PL/pgSQL: no C, no background worker, no advisory lock. The
-- behaviour contract is specs/SEMANTICS.md; the invariants I1-I11 are in
-- specs/INVARIANTS.md. Points of method that every function below follows:
--
--  * Time authority is the server: "now" is clock_timestamp(), read once per
--    decision, after the row lock that decision needs is held. No function
--    accepts a client timestamp.
--  * Lazy expiry: a row is HELD while owner IS NOT NULL AND expires_at > now.
--    Nothing ever deletes or rewrites a row because time passed.
--  * Lock discipline: a call that changes nothing keeps no row lock. Every
--    locking step runs inside a PL/pgSQL block with an EXCEPTION clause, that
--    is a subtransaction; when the decision is "no change" the block raises
--    the private SQLSTATE 'LEASE', which rolls the subtransaction back and
--    with it the row lock. So a denied acquire, a failed renew or release, an
--    inspect, or a waiting blocking acquire, left inside an open transaction,
--    never blocks the holder.
--  * Durability: a call that changes a lease makes its transaction's commit
--    durable even when the session runs with synchronous_commit = off.
--  * Every error fails closed: nothing changes.

\echo Use "CREATE EXTENSION pg_lease" to load this file. \quit

-- Added after the release, the only change to this script: search_path
-- pinned first, so that no statement below resolves a name in a schema
-- another role can create in. The extension command restores it afterwards.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- The schema is created here, not by the control file, so that it belongs to
-- the extension and DROP EXTENSION removes it with every lease row.
CREATE SCHEMA lease;
COMMENT ON SCHEMA lease IS 'pg_lease: time-bounded leases with fencing epochs';

-- One row per key that has ever been granted.
--   HELD:   owner IS NOT NULL AND expires_at >  now   (expires_at: end of grant)
--   LAPSED: owner IS NOT NULL AND expires_at <= now   (owner: the former holder)
--   FREE:   owner IS NULL                             (expires_at: release time)
-- epoch is the key's fencing counter: the epoch of the current or last grant,
-- or, after a release, one more than the released grant's epoch. It never
-- decreases. lapsed_owner/lapsed_epoch name the grant that lapsed and was
-- taken over by the current (or last) one, so that its former holder is told
-- "lapsed" rather than "not_owner"; they are NULL when the grant started from
-- a free key. Only non-indexed columns change after insertion, and the table
-- keeps free space on every page, so renewals are HOT updates.
CREATE TABLE lease.leases (
    key         text        NOT NULL,
    owner       text,
    epoch       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    lapsed_owner text,
    lapsed_epoch bigint,
    CONSTRAINT leases_pkey PRIMARY KEY (key),
    CONSTRAINT leases_epoch_positive CHECK (epoch >= 1)
) WITH (fillfactor = 50);

COMMENT ON TABLE lease.leases IS
  'pg_lease internal state; use the lease.* functions, never this table';

-- ---------------------------------------------------------------------------
-- Internal helpers (names start with an underscore). They carry no SET clause
-- so that the planner can inline the SQL ones into their callers; they are
-- only called from the API functions below, whose search_path is pinned, and
-- EXECUTE on them is revoked from PUBLIC.
--
-- Input validation. Each helper returns NULL when the value is valid, else a
-- sentence naming the violated constraint; callers collect every violation
-- into the DETAIL of one invalid_input (22023) error.
-- ---------------------------------------------------------------------------

CREATE FUNCTION lease._text_violation(what text, v text)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
    WHEN v IS NULL THEN what || ' must not be NULL'
    WHEN v = '' THEN what || ' must not be empty'
    WHEN octet_length(v) > 1024 THEN what || ' must be at most 1024 bytes'
  END
$$;

-- A duration (ttl or wait) is measured in seconds: months count 30 days and
-- days 24 hours, whatever the session's time zone, so a lease always lasts
-- exactly the duration given. positive: ttl (> 0); otherwise wait (>= 0).
-- The last check keeps now + v inside timestamptz's range with a second to
-- spare, so computing the expiry or the deadline cannot overflow.
CREATE FUNCTION lease._duration_violation(what text, v interval, positive boolean)
RETURNS text LANGUAGE sql VOLATILE
AS $$
  SELECT CASE
    WHEN v IS NULL THEN what || ' must not be NULL'
    WHEN NOT isfinite(v) THEN what || ' must be finite'
    WHEN positive AND extract(epoch FROM v) <= 0 THEN what || ' must be positive'
    WHEN NOT positive AND extract(epoch FROM v) < 0 THEN what || ' must not be negative'
    WHEN extract(epoch FROM v) >= extract(epoch FROM timestamptz '294276-12-31 23:59:59+00')
                                  - extract(epoch FROM clock_timestamp()) - 1
      THEN what || ' is too large: server time + ' || what || ' would overflow timestamptz'
  END
$$;

-- The epoch of a key's first grant. (A later version replaces this to start
-- new keys above the epochs of keys that clean-up removed.)
CREATE FUNCTION lease._first_epoch()
RETURNS bigint LANGUAGE sql STABLE
AS $$ SELECT 1::bigint $$;

CREATE FUNCTION lease._epoch_violation(v bigint)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
    WHEN v IS NULL THEN 'epoch must not be NULL'
    WHEN v < 1 THEN 'epoch must be at least 1'
  END
$$;

CREATE FUNCTION lease._raise_invalid(violations text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  violations := array_remove(violations, NULL);
  IF cardinality(violations) > 0 THEN
    RAISE EXCEPTION 'invalid_input'
      USING ERRCODE = '22023', DETAIL = array_to_string(violations, '; ');
  END IF;
END
$$;

-- The duration actually applied: the same number of seconds, as an interval
-- with no day or month part (time-zone independent arithmetic).
CREATE FUNCTION lease._seconds(v interval)
RETURNS interval LANGUAGE sql IMMUTABLE
AS $$ SELECT make_interval(secs => extract(epoch FROM v)::double precision) $$;

-- Status of (owner, epoch) against a row read at server time now.
-- Precedence: not_owner (no row, free key, or another owner), then lapsed
-- (the caller held the key and that grant expired), then epoch_mismatch.
-- A holder whose grant lapsed and was then taken over is told lapsed, not
-- not_owner: the row remembers the grant that the takeover ended.
CREATE FUNCTION lease._holder_status(found boolean, row_owner text, row_epoch bigint,
                                     row_expires timestamptz, row_lapsed_owner text,
                                     row_lapsed_epoch bigint, p_owner text, p_epoch bigint,
                                     now timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
    WHEN NOT found OR row_owner IS NULL THEN 'not_owner'
    WHEN row_owner <> p_owner THEN
      CASE WHEN row_lapsed_owner = p_owner AND row_lapsed_epoch = p_epoch
           THEN 'lapsed' ELSE 'not_owner' END
    WHEN row_expires <= now THEN 'lapsed'
    WHEN row_epoch <> p_epoch THEN 'epoch_mismatch'
    ELSE 'ok'
  END
$$;

-- Called after every change of a lease, inside the changing transaction.
--  * Durability: with synchronous_commit = off the transaction's commit could
--    return before its WAL is flushed, and a crash would forget a grant that a
--    client already acts on (the same epoch could then be handed out twice).
--    Raise the setting to 'local' for this transaction only; every other value
--    already flushes locally and is left as it is.
--  * Notification: NOTIFY on channel pg_lease, delivered only if the
--    transaction commits, so waiters wake on release instead of polling. A
--    session, role or database can turn it off with SET pg_lease.notify = off.
--    Renewals are not announced (lease.renew forces durability only).
CREATE FUNCTION lease._changed(event text, key text, owner text, epoch bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF current_setting('synchronous_commit') = 'off' THEN
    PERFORM set_config('synchronous_commit', 'local', true);
  END IF;
  IF coalesce(lower(current_setting('pg_lease.notify', true)), '')
       NOT IN ('off', 'false', 'no', '0', 'f', 'n') THEN
    PERFORM pg_notify('pg_lease', json_build_object(
      'event', event, 'key', key, 'owner', owner, 'epoch', epoch)::text);
  END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- The API
-- ---------------------------------------------------------------------------

CREATE FUNCTION lease.acquire(key text, owner text, ttl interval, wait interval DEFAULT '0',
                              OUT acquired boolean, OUT epoch bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key      text := key;
  v_owner    text := owner;
  v_ttl      interval;
  v_deadline timestamptz;
  v_now      timestamptz;
  v_found    boolean;
  v_first    bigint;
  r_owner    text;
  r_epoch    bigint;
  r_expires  timestamptz;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._duration_violation('ttl', ttl, true),
    lease._duration_violation('wait', wait, false)]);
  v_ttl := lease._seconds(ttl);

  IF extract(epoch FROM wait) > 0 THEN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      -- A wait under REPEATABLE READ or SERIALIZABLE would only ever see the
      -- transaction's snapshot: it could not observe a release.
      RAISE EXCEPTION 'invalid_isolation'
        USING ERRCODE = '25000',
              DETAIL = format('a blocking acquire (wait > 0) needs READ COMMITTED; this transaction is %s',
                              upper(current_setting('transaction_isolation'))),
              HINT = 'Run blocking acquires in READ COMMITTED, or call with wait => 0 and retry.';
    END IF;
    v_deadline := clock_timestamp() + lease._seconds(wait);
  END IF;

  LOOP
    -- Unlocked read: decides the cases that change nothing without locking.
    SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires
      FROM lease.leases l WHERE l.key = v_key;
    v_found := FOUND;

    IF NOT v_found THEN
      -- First grant of a never-leased key: the insertion is the lock. (If it
      -- waited for a concurrent first grant that rolled back, the grant is
      -- shorter by that wait, never longer.)
      v_now := clock_timestamp();
      INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, acquired_at)
        VALUES (v_key, v_owner, lease._first_epoch(), v_now + v_ttl, v_now)
        ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
        RETURNING l.epoch, l.expires_at INTO epoch, expires_at;
      IF FOUND THEN
        -- The first epoch was read with this INSERT's snapshot, before the
        -- insertion waited for any concurrent change of the key. A clean-up
        -- (0.2.0) that removed an older row of this key may have committed
        -- during that wait, raising the floor past what was read: read it
        -- again now, and move the new row, still this transaction's own,
        -- above it. (With 0.1.0's constant first epoch this never fires.)
        v_first := lease._first_epoch();
        IF v_first > epoch THEN
          UPDATE lease.leases l SET epoch = v_first WHERE l.key = v_key
          RETURNING l.epoch INTO epoch;
        END IF;
        acquired := true;
        PERFORM lease._changed('acquired', v_key, v_owner, epoch);
        RETURN;
      END IF;
      CONTINUE;  -- another session created the row first: read it
    END IF;

    v_now := clock_timestamp();
    IF r_owner IS NOT NULL AND r_expires > v_now THEN
      IF r_owner = v_owner THEN
        -- Idempotent: the caller already holds it. Same epoch, same expiry.
        acquired := true; epoch := r_epoch; expires_at := r_expires;
        RETURN;
      END IF;
      -- Held by another owner: fall through to denial or wait.
    ELSE
      -- Free or lapsed when read: lock, read the clock, decide again.
      BEGIN
        SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires
          FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
        IF NOT FOUND THEN
          RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- row removed: start over
        END IF;
        v_now := clock_timestamp();
        IF r_owner IS NOT NULL AND r_expires > v_now THEN
          -- Granted to someone (maybe this owner) since the unlocked read.
          RAISE EXCEPTION USING ERRCODE = 'LEASE';
        END IF;
        -- A takeover (the row still names the lapsed holder) remembers the
        -- grant it ends; a grant of a free key forgets any older takeover.
        UPDATE lease.leases l
           SET owner = v_owner, epoch = l.epoch + 1,
               expires_at = v_now + v_ttl, acquired_at = v_now,
               lapsed_owner = r_owner, lapsed_epoch = CASE WHEN r_owner IS NOT NULL THEN r_epoch END
         WHERE l.key = v_key
        RETURNING l.epoch, l.expires_at INTO epoch, expires_at;
        acquired := true;
      EXCEPTION WHEN SQLSTATE 'LEASE' THEN
        -- The lock, if taken, is gone with the subtransaction. Read again.
        CONTINUE;
      END;
      PERFORM lease._changed('acquired', v_key, v_owner, epoch);
      RETURN;
    END IF;

    -- Denied: the key is held by another owner until r_expires.
    IF v_deadline IS NULL THEN
      acquired := false; epoch := NULL; expires_at := NULL;
      RETURN;
    END IF;
    v_now := clock_timestamp();
    IF v_now >= v_deadline THEN
      RAISE EXCEPTION 'timeout'
        USING ERRCODE = '57014',
              DETAIL = format('key %L stayed held by another owner for the whole wait of %s',
                              v_key, wait);
    END IF;
    -- Poll every 50 ms, but wake exactly at the holder's expiry or at the
    -- deadline when either comes sooner. No lock is held while sleeping.
    PERFORM pg_sleep(greatest(0.0005, least(
      0.05,
      extract(epoch FROM v_deadline - v_now)::double precision,
      extract(epoch FROM r_expires - v_now)::double precision)));
  END LOOP;
END
$$;

CREATE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key     text := key;
  v_owner   text := owner;
  v_epoch   bigint := epoch;
  v_ttl     interval;
  v_now     timestamptz;
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_lowner  text;
  r_lepoch  bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch),
    lease._duration_violation('ttl', ttl, true)]);
  v_ttl := lease._seconds(ttl);

  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, v_now);
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET expires_at = v_now + v_ttl
     WHERE l.key = v_key
    RETURNING l.expires_at INTO expires_at;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    expires_at := NULL;  -- status says why; the lock went with the subtransaction
    RETURN;
  END;
  -- Durability as in lease._changed, but no notification: a renewal wakes
  -- nobody (waiters wait for a release or an expiry), and every NOTIFY takes
  -- a server-wide lock until its transaction's commit is flushed, which
  -- would serialize the hot path of every holder.
  IF current_setting('synchronous_commit') = 'off' THEN
    PERFORM set_config('synchronous_commit', 'local', true);
  END IF;
  RETURN;
END
$$;

CREATE FUNCTION lease.release(key text, owner text, epoch bigint, OUT status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key     text := key;
  v_owner   text := owner;
  v_epoch   bigint := epoch;
  v_now     timestamptz;
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_lowner  text;
  r_lepoch  bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch)]);

  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, v_now);
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now
     WHERE l.key = v_key;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;
  END;
  PERFORM lease._changed('released', v_key, v_owner, v_epoch);
  RETURN;
END
$$;

CREATE FUNCTION lease.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_key text := key;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  RETURN QUERY
    SELECT h, CASE WHEN h THEN l.owner END, l.epoch, CASE WHEN h THEN l.expires_at END
      FROM lease.leases l,
           LATERAL (SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h) s
     WHERE l.key = v_key;
END
$$;

-- Every key with the same lazy-expiry reporting as inspect, plus when the
-- current grant began (NULL unless held). Keys in ascending order.
CREATE FUNCTION lease.list()
RETURNS TABLE (key text, held boolean, owner text, epoch bigint,
               acquired_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT l.key, s.h, CASE WHEN s.h THEN l.owner END, l.epoch,
         CASE WHEN s.h THEN l.acquired_at END, CASE WHEN s.h THEN l.expires_at END
    FROM lease.leases l,
         LATERAL (SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h) s
   ORDER BY l.key
$$;

-- Fenced write in the same database: called inside the caller's own
-- transaction, asserts that (key, owner, epoch) is the current, unexpired
-- grant and keeps a FOR SHARE lock on the row until that transaction ends, so
-- no takeover (nor release) can commit before the caller's writes do. Raises
-- SQLSTATE 55000 with message not_owner, lapsed or epoch_mismatch otherwise.
-- Returns the grant's expiry.
CREATE FUNCTION lease.fence(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key     text := key;
  v_owner   text := owner;
  v_epoch   bigint := epoch;
  v_status  text;
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_lowner  text;
  r_lepoch  bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch)]);
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch
    FROM lease.leases l WHERE l.key = v_key FOR SHARE;
  v_status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, clock_timestamp());
  IF v_status <> 'ok' THEN
    RAISE EXCEPTION '%', v_status
      USING ERRCODE = '55000',
            DETAIL = format('key %L: owner %L with epoch %s is not the current holder (current epoch %s)',
                            v_key, v_owner, v_epoch, coalesce(r_epoch::text, 'none'));
  END IF;
  RETURN r_expires;
END
$$;

-- Operators only (EXECUTE is revoked from PUBLIC): frees a key whatever its
-- holder and increments its epoch, so the former holder is fenced. Returns
-- whether a grant (held or lapsed) was ended, its owner, and the key's epoch
-- counter afterwards.
CREATE FUNCTION lease.force_release(key text,
                                    OUT released boolean, OUT previous_owner text, OUT epoch bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key     text := key;
  r_owner   text;
  r_epoch   bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  released := false;
  BEGIN
    SELECT l.owner, l.epoch INTO r_owner, r_epoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    epoch := r_epoch;
    IF r_owner IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- never leased, or already free
    END IF;
    UPDATE lease.leases l
       SET owner = NULL, epoch = l.epoch + 1, expires_at = clock_timestamp()
     WHERE l.key = v_key
    RETURNING l.epoch INTO epoch;
    released := true;
    previous_owner := r_owner;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;
  END;
  PERFORM lease._changed('force_released', v_key, r_owner, r_epoch);
  RETURN;
END
$$;

CREATE FUNCTION lease.version()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.1.0'::text $$;

-- ---------------------------------------------------------------------------
-- Ownership and privileges. Everything belongs to the role that installed the
-- extension (for a trusted install by a non-superuser, that role rather than
-- the bootstrap superuser, so the SECURITY DEFINER functions run with no more
-- privilege than the installer has). The table is reachable by its owner only;
-- every other role uses the functions.
-- ---------------------------------------------------------------------------

ALTER SCHEMA lease OWNER TO @extowner@;
ALTER TABLE lease.leases OWNER TO @extowner@;
ALTER FUNCTION lease._text_violation(text, text) OWNER TO @extowner@;
ALTER FUNCTION lease._duration_violation(text, interval, boolean) OWNER TO @extowner@;
ALTER FUNCTION lease._epoch_violation(bigint) OWNER TO @extowner@;
ALTER FUNCTION lease._first_epoch() OWNER TO @extowner@;
ALTER FUNCTION lease._raise_invalid(text[]) OWNER TO @extowner@;
ALTER FUNCTION lease._seconds(interval) OWNER TO @extowner@;
ALTER FUNCTION lease._holder_status(boolean, text, bigint, timestamptz, text, bigint, text, bigint, timestamptz) OWNER TO @extowner@;
ALTER FUNCTION lease._changed(text, text, text, bigint) OWNER TO @extowner@;
ALTER FUNCTION lease.acquire(text, text, interval, interval) OWNER TO @extowner@;
ALTER FUNCTION lease.renew(text, text, bigint, interval) OWNER TO @extowner@;
ALTER FUNCTION lease.release(text, text, bigint) OWNER TO @extowner@;
ALTER FUNCTION lease.inspect(text) OWNER TO @extowner@;
ALTER FUNCTION lease.list() OWNER TO @extowner@;
ALTER FUNCTION lease.fence(text, text, bigint) OWNER TO @extowner@;
ALTER FUNCTION lease.force_release(text) OWNER TO @extowner@;
ALTER FUNCTION lease.version() OWNER TO @extowner@;

REVOKE ALL ON SCHEMA lease FROM PUBLIC;
GRANT USAGE ON SCHEMA lease TO PUBLIC;
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._text_violation(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._duration_violation(text, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._epoch_violation(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._first_epoch() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_invalid(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._seconds(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._holder_status(boolean, text, bigint, timestamptz, text, bigint, text, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._changed(text, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.force_release(text) FROM PUBLIC;

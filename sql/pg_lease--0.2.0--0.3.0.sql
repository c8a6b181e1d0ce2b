-- pg_lease 0.2.0 -> 0.3.0: epochs that never repeat (any isolation level,
-- dump and restore, failover), grants bound to the database role that took
-- them, privileges that hold whatever default privileges the installer set,
-- and every input answered cleanly. The short spec for other components is
-- /work/plan/SQL-0.3.0.md in development and specs/SEMANTICS.md in the repo.
--
-- What changes (every 0.2.0 row and epoch is kept as it is):
--
--  * Roles. lease.leases.holder_role records session_user at every grant.
--    renew, release and fence succeed only for a member of that role
--    (pg_has_role(session_user, holder_role, 'MEMBER')); anyone else is told
--    not_owner. An acquire by the holder's owner string from another role is
--    "held by another". Rows from 0.2.0 have holder_role NULL: not bound to a
--    role (any role may renew or release them, as before) until their next grant.
--  * Timelines. Every grant path reads the server's WAL timeline
--    (pg_walfile_name(pg_current_wal_lsn())). lease.timeline_state records the
--    timeline last seen and an era: epochs granted in era e are at least
--    e * 2^40 + 1, and a timeline change (a promotion) moves to a higher era,
--    so a promoted standby never re-issues an epoch that the old primary may
--    have handed out (bound: fewer than 2^40 epoch increments of one key per
--    timeline). A cluster that never failed over stays in era 0: 1, 2, 3.
--  * Grace. After a timeline change is first seen, no new grant is made
--    until that moment + the promotion grace (the configured max_ttl, or a
--    higher one that was in force within the last such period); renewals
--    and idempotent acquires go on. lease.configure(max_ttl) sets the maximum
--    ttl (default 1 hour) that acquire and renew accept.
--  * Durability forcing raises synchronous_commit off AND local to on, so a
--    change waits for the configured synchronous standbys.
--  * Read-only: acquire, renew, release, fence, force_release, cleanup and
--    configure raise 25006 read_only on a standby or in a read-only
--    transaction, before touching anything.
--  * Isolation: under REPEATABLE READ and SERIALIZABLE the floor and an
--    idempotent acquire's row are read with a lock, so a change committed
--    after the snapshot raises 40001 instead of answering a stale epoch.
--  * Wait bound: acquire's row-lock waits (and a first grant's wait for a
--    concurrent first grant) are bounded by lock_timeout = what is left of
--    the wait (wait 0: NOWAIT; a first grant's insertion 1 ms, three times at
--    most), so wait 0 answers at once and wait > 0 raises
--    timeout at its bound even behind a fence.
--  * Inputs: keys and owners with control characters (U+0001-U+001F, U+007F)
--    are invalid, so the NOTIFY payload stays under 8000 bytes (at most 4200);
--    ttl + wait and cleanup's free_for are checked against the timestamptz range.
--  * Dump: lease.leases, lease.epoch_floor, lease.timeline_state and
--    lease.settings are extension configuration tables (pg_dump keeps their
--    rows). The singleton tables tolerate the extra row a restore adds (their
--    readers take the maximum), so a restore never conflicts with the rows
--    CREATE EXTENSION makes.
--  * Privileges are reset at the end: every member's ACL is emptied of every
--    grantee but the owner, then the intended grants are made again.

\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.3.0'" to load this file. \quit

-- Added after the release, the only change to this script: search_path
-- pinned first, so that no statement below resolves a name in a schema
-- another role can create in. The extension command restores it afterwards.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- ---------------------------------------------------------------------------
-- State
-- ---------------------------------------------------------------------------

ALTER TABLE lease.leases ADD COLUMN holder_role text;
COMMENT ON COLUMN lease.leases.holder_role IS
  'pg_lease internal: session_user of the grant (NULL: granted before 0.3.0, or free)';

-- A restore adds the dumped floor row next to the one CREATE EXTENSION made:
-- no primary key, the floor is the maximum of the rows. Only rows above 0 are
-- dumped (the 0 row is what every install makes).
ALTER TABLE lease.epoch_floor DROP CONSTRAINT epoch_floor_pkey;

-- The server's current WAL timeline. Raises 55000 on a standby.
CREATE FUNCTION lease._timeline()
RETURNS bigint LANGUAGE sql VOLATILE
AS $$
  SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- The timeline last seen by a grant path and its era. Several rows only after
-- a restore: the row with the highest era is the state.
CREATE TABLE lease.timeline_state (
    timeline    bigint      NOT NULL,
    era         bigint      NOT NULL CHECK (era >= 0 AND era < 8388607),
    grace_until timestamptz
);
COMMENT ON TABLE lease.timeline_state IS
  'pg_lease internal: the WAL timeline last seen, its epoch era, no new grant before grace_until';
INSERT INTO lease.timeline_state (timeline, era) VALUES (lease._timeline(), 0);

-- Registrations of sessions waiting for notifications (lease.listen). UNLOGGED:
-- they belong to live backends, which a crash ends anyway; never dumped.
CREATE UNLOGGED TABLE lease.listeners (
    pid   integer     NOT NULL,
    key   text        NOT NULL,
    since timestamptz NOT NULL,
    CONSTRAINT listeners_pkey PRIMARY KEY (key, pid)
);
COMMENT ON TABLE lease.listeners IS
  'pg_lease internal: backends waiting for notifications of a key (''*'': every key)';

-- Operator settings (lease.configure). No row: the defaults.
CREATE TABLE lease.settings (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_ttl      interval NOT NULL,
    prev_max_ttl interval,
    prev_until   timestamptz
);
COMMENT ON TABLE lease.settings IS
  'pg_lease internal: operator settings (lease.configure); no row means the defaults';
-- Grants made before this update may be longer than the new default max_ttl
-- (1 hour): the promotion grace covers them until the longest one ends, as if
-- an operator had just lowered max_ttl from their length. (Their holders'
-- renewals must ask for at most max_ttl from now on, or an operator raises it.)
INSERT INTO lease.settings (max_ttl, prev_max_ttl, prev_until)
SELECT interval '1 hour', lease._seconds(max(l.expires_at) - clock_timestamp()), max(l.expires_at)
  FROM lease.leases l
 WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp() + interval '1 hour'
HAVING count(*) > 0;

-- ---------------------------------------------------------------------------
-- Internal helpers
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION lease._text_violation(what text, v text)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
    WHEN v IS NULL THEN what || ' must not be NULL'
    WHEN v = '' THEN what || ' must not be empty'
    WHEN octet_length(v) > 1024 THEN what || ' must be at most 1024 bytes'
    WHEN v ~ '[\x01-\x1f\x7f]' THEN what || ' must not contain control characters (U+0001 to U+001F, U+007F)'
  END
$$;

-- (The helpers that read a table are PL/pgSQL, not SQL: a SQL function with a
-- subquery is not inlined and would be planned again at every call.)
CREATE FUNCTION lease._max_ttl()
RETURNS interval LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour');
END
$$;

-- The grace a timeline change seen now imposes: the max_ttl, or a higher one
-- in force until prev_until (grants made under it may still be believed).
CREATE FUNCTION lease._grace()
RETURNS interval LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RETURN coalesce((SELECT CASE WHEN s.prev_until > clock_timestamp() AND s.prev_max_ttl > s.max_ttl
                               THEN s.prev_max_ttl ELSE s.max_ttl END
                     FROM lease.settings s), interval '1 hour');
END
$$;

-- ttl against the configured maximum, and ttl + wait against the timestamptz
-- range (a blocking acquire computes its expiry after the wait). NULL when
-- either is NULL (their own checks report it).
CREATE FUNCTION lease._ttl_violation(ttl interval, wait interval)
RETURNS text LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_max interval;
BEGIN
  IF lease._duration_violation('ttl', ttl, true) IS NOT NULL THEN
    RETURN NULL;
  END IF;
  v_max := lease._max_ttl();
  IF extract(epoch FROM ttl) > extract(epoch FROM v_max) THEN
    RETURN 'ttl must be at most max_ttl (' || trim_scale(extract(epoch FROM v_max))::text
           || ' s, set by lease.configure)';
  END IF;
  IF lease._duration_violation('wait', wait, false) IS NOT NULL THEN
    RETURN NULL;
  END IF;
  IF extract(epoch FROM ttl) + extract(epoch FROM wait)
     >= extract(epoch FROM timestamptz '294276-12-31 23:59:59+00') - extract(epoch FROM clock_timestamp()) - 1 THEN
    RETURN 'ttl + wait is too large: server time + wait + ttl would overflow timestamptz';
  END IF;
  RETURN NULL;
END
$$;

-- free_for of cleanup: the oldest expiry it removes, server time - free_for,
-- must stay inside timestamptz's range.
CREATE FUNCTION lease._free_for_violation(v interval)
RETURNS text LANGUAGE sql VOLATILE
AS $$
  SELECT CASE
    WHEN v IS NULL OR NOT isfinite(v) THEN NULL
    WHEN extract(epoch FROM clock_timestamp()) - extract(epoch FROM v)
         <= extract(epoch FROM timestamptz '4713-11-24 00:00:00+00 BC') + 1
      THEN 'free_for is too large: server time - free_for would underflow timestamptz'
  END
$$;

CREATE FUNCTION lease._raise_read_only(fn text)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RAISE EXCEPTION 'read_only'
    USING ERRCODE = '25006',
          DETAIL = CASE WHEN pg_catalog.pg_is_in_recovery()
                        THEN format('%s needs a read-write primary; this server is a standby (recovery is in progress)', fn)
                        ELSE format('%s needs a read-write transaction; this transaction is read-only', fn) END,
          HINT = 'Connect to the primary (for example with target_session_attrs=read-write).';
END
$$;

-- Whether session_user may act on a grant taken by holder_role: the same
-- role, a member of it, or a grant from before 0.3.0 (NULL). A dropped role's
-- grant can only lapse.
-- (Callers test the common case, NULL or session_user itself, inline first.)
CREATE FUNCTION lease._may_act(holder_role text)
RETURNS boolean LANGUAGE plpgsql STABLE
AS $$
BEGIN
  IF holder_role IS NULL OR holder_role = session_user::text THEN
    RETURN true;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = holder_role) THEN
    RETURN false;
  END IF;
  RETURN pg_catalog.pg_has_role(session_user, holder_role::name, 'MEMBER');
END
$$;

-- The epoch floor (cleanup). locked: under REPEATABLE READ or SERIALIZABLE,
-- read the rows with a lock, so a floor raised after the snapshot raises
-- 40001 instead of being missed.
CREATE OR REPLACE FUNCTION lease._first_epoch()
RETURNS bigint LANGUAGE sql STABLE
AS $$ SELECT coalesce(max(f.floor), 0) + 1 FROM lease.epoch_floor f $$;

CREATE FUNCTION lease._floor(locked boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF locked THEN
    PERFORM FROM lease.epoch_floor f FOR SHARE;
  END IF;
  RETURN (SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f);
END
$$;

-- lock_timeout for acquire's lock waits: what is left of the wait (deadline
-- NULL: wait 0, 1 ms), at least 1 ms, at most lock_timeout's maximum.
CREATE FUNCTION lease._lock_timeout(deadline timestamptz)
RETURNS text LANGUAGE sql VOLATILE
AS $$
  SELECT CASE WHEN deadline IS NULL THEN '1'
    ELSE least(2147483647, greatest(1, ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000)))::bigint::text
  END
$$;

-- Called on every grant path (free, lapsed or never-leased key), outside any
-- subtransaction, before the grant. Returns the era's epoch base (every epoch
-- granted now must exceed it) and when the grace after the last timeline
-- change ends. When the server's timeline differs from the one recorded, this
-- is the first grant path on a new timeline (a promotion, or a restore into
-- another cluster): it moves to a higher era (by the timeline difference when
-- the timeline grew, so that two successive promotions cannot share an era;
-- by one otherwise) and starts the grace. That update commits with the
-- caller's transaction; if it rolls back, the next grant path starts the grace
-- again, later (the safe direction).
CREATE FUNCTION lease._grant_context(OUT base bigint, OUT grace_until timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_tl    bigint := lease._timeline();
  s_tl    bigint;
  s_era   bigint;
  s_grace timestamptz;
  v_era   bigint;
BEGIN
  LOOP
    SELECT t.timeline, t.era, t.grace_until INTO s_tl, s_era, s_grace
      FROM lease.timeline_state t ORDER BY t.era DESC, t.timeline DESC LIMIT 1;
    IF NOT FOUND THEN
      -- The state row was removed by hand: start above every epoch stored.
      SELECT greatest(coalesce(max(l.epoch), 0), lease._first_epoch()) >> 40 INTO s_era FROM lease.leases l;
      INSERT INTO lease.timeline_state (timeline, era, grace_until)
        VALUES (v_tl, s_era + 1, clock_timestamp() + lease._grace());
      CONTINUE;
    END IF;
    IF s_tl = v_tl THEN
      base := s_era << 40;
      grace_until := s_grace;
      RETURN;
    END IF;
    v_era := s_era + CASE WHEN v_tl > s_tl THEN v_tl - s_tl ELSE 1 END;
    UPDATE lease.timeline_state t
       SET timeline = v_tl, era = v_era,
           grace_until = greatest(t.grace_until, clock_timestamp() + lease._grace())
     WHERE t.timeline <> v_tl;
    -- none updated: another session's change committed meanwhile; read it
  END LOOP;
END
$$;

-- Durability as in 0.2.0, raised to 'on': off and local do not wait for
-- synchronous standbys; on does (and is a local flush without any).
--
-- Notification (pg_lease.notify): by default (unset, 'waiters', any other
-- value) only when some session registered with lease.listen for this key
-- or for '*' (issue 17: a NOTIFY takes a server-wide lock through its
-- commit's flush, so notifying nobody has a price; the Go module of this
-- release registers every key it waits for). on/always/true/yes/1/t/y:
-- always, as 0.1.0/0.2.0 did (for listeners that do not register).
-- off/false/no/0/f/n: never.
CREATE OR REPLACE FUNCTION lease._changed(event text, key text, owner text, epoch bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_mode text := coalesce(lower(current_setting('pg_lease.notify', true)), '');
BEGIN
  IF current_setting('synchronous_commit') IN ('off', 'local') THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  IF v_mode IN ('off', 'false', 'no', '0', 'f', 'n') THEN
    RETURN;
  END IF;
  IF v_mode NOT IN ('on', 'always', 'true', 'yes', '1', 't', 'y')
     AND NOT EXISTS (SELECT 1 FROM lease.listeners w WHERE w.key = _changed.key OR w.key = '*') THEN
    RETURN;
  END IF;
  PERFORM pg_notify('pg_lease', json_build_object(
    'event', event, 'key', key, 'owner', owner, 'epoch', epoch)::text);
END
$$;

-- ---------------------------------------------------------------------------
-- The API
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION lease.acquire(key text, owner text, ttl interval, wait interval DEFAULT '0',
                              OUT acquired boolean, OUT epoch bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key      text := key;
  v_owner    text := owner;
  v_role     text := session_user;
  v_rc       boolean := current_setting('transaction_isolation') = 'read committed';
  v_ttl      interval;
  v_deadline timestamptz;
  v_now      timestamptz;
  v_found    boolean;
  v_first    bigint;
  v_lt       text;
  v_base     bigint;
  v_grace    timestamptz;
  v_in_grace boolean;
  v_mine     boolean;
  v_busy     int := 0;
  r_owner    text;
  r_epoch    bigint;
  r_expires  timestamptz;
  r_role     text;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._duration_violation('ttl', ttl, true),
    lease._duration_violation('wait', wait, false),
    -- (the max_ttl probe inline, a cached plan; the helper only when needed)
    CASE WHEN ttl IS NOT NULL AND isfinite(ttl)
          AND (extract(epoch FROM ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour'))
               OR (wait IS NOT NULL AND isfinite(wait) AND extract(epoch FROM wait) > 0))
         THEN lease._ttl_violation(ttl, wait) END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.acquire');
  END IF;
  v_ttl := lease._seconds(ttl);

  IF extract(epoch FROM wait) > 0 THEN
    IF NOT v_rc THEN
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
    v_in_grace := false;
    -- Unlocked read: decides the cases that change nothing without locking.
    SELECT l.owner, l.epoch, l.expires_at, l.holder_role INTO r_owner, r_epoch, r_expires, r_role
      FROM lease.leases l WHERE l.key = v_key;
    v_found := FOUND;
    v_now := clock_timestamp();

    IF v_found AND r_owner IS NOT NULL AND r_expires > v_now THEN
      -- The caller's own grant: same owner string, and its role (or a member).
      v_mine := r_owner = v_owner AND (r_role IS NULL OR r_role = v_role OR lease._may_act(r_role));
      IF v_mine AND v_base IS NULL THEN
        -- A grant of an earlier era seen during the grace after a timeline
        -- change may be one whose release was lost with the old primary,
        -- while a successor's grant, also lost, is still believed: it is not
        -- handed back by an idempotent acquire until the grace ends (by then
        -- it has lapsed: its ttl was at most max_ttl). Renewals with its
        -- token go on. (Outside a grace this costs one timeline read.)
        SELECT g.base, g.grace_until INTO v_base, v_grace FROM lease._grant_context() g;
      END IF;
      IF v_mine AND v_grace IS NOT NULL AND clock_timestamp() < v_grace AND r_epoch <= v_base THEN
        v_in_grace := true;
        r_expires := least(r_expires, v_grace);
      ELSIF v_mine THEN
        -- Idempotent: the caller already holds it. Same epoch, same expiry.
        -- Under REPEATABLE READ / SERIALIZABLE the row read is the snapshot's:
        -- a locked read (FOR SHARE conflicts with every change of the row;
        -- the lock is released at once) raises 40001 if it changed since. A
        -- row locked right now by another transaction is not waited for
        -- (wait is 0 at these levels): that is 40001 too.
        IF NOT v_rc THEN
          BEGIN
            PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE NOWAIT;
            RAISE EXCEPTION USING ERRCODE = 'LEASE';
          EXCEPTION
            WHEN SQLSTATE 'LEASE' THEN
              NULL;
            WHEN lock_not_available THEN
              RAISE EXCEPTION 'could not serialize access: key %L is being changed by another transaction', v_key
                USING ERRCODE = '40001',
                      HINT = 'Retry the transaction.';
          END;
        END IF;
        acquired := true; epoch := r_epoch; expires_at := r_expires;
        RETURN;
      END IF;
      -- Held by another owner (or by this owner string under another role):
      -- fall through to denial or wait.
    ELSE
      -- A grant path: the timeline, once per call, outside any subtransaction.
      IF v_base IS NULL THEN
        SELECT g.base, g.grace_until INTO v_base, v_grace FROM lease._grant_context() g;
      END IF;
      IF v_grace IS NOT NULL AND clock_timestamp() < v_grace THEN
        -- After a timeline change: no new grant before the grace ends.
        v_in_grace := true;
        r_expires := v_grace;
      ELSE
        v_lt := current_setting('lock_timeout');
        BEGIN
          -- Every lock wait below is bounded by what is left of the wait.
          -- With wait 0 the row lock is taken NOWAIT and nothing else is
          -- bounded: a lock_timeout would also cut the waits for the
          -- server's own short locks (extending the table or an index, for
          -- one) and deny a free key under load. A first grant's insertion,
          -- which can only wait, waits 1 ms at a time, three times at most.
          IF v_deadline IS NOT NULL OR NOT v_found THEN
            PERFORM set_config('lock_timeout', lease._lock_timeout(v_deadline), true);
          END IF;
          IF NOT v_found THEN
            -- First grant of a never-leased key: the insertion is the lock. (If
            -- it waited for a concurrent first grant that rolled back, the grant
            -- is shorter by that wait, never longer.)
            v_first := greatest(lease._floor(NOT v_rc), v_base) + 1;
            v_now := clock_timestamp();
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, acquired_at, holder_role)
              VALUES (v_key, v_owner, v_first, v_now + v_ttl, v_now, v_role)
              ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
              RETURNING l.epoch, l.expires_at INTO epoch, expires_at;
            IF NOT FOUND THEN
              RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- another session created it first: read it
            END IF;
            IF v_rc THEN
              -- The floor was read with the INSERT's snapshot, before the
              -- insertion waited for any concurrent change of the key; a
              -- clean-up may have committed during that wait: read it again
              -- and move the new row, still this transaction's own, above it.
              -- (Under the other levels the floor rows are locked: no clean-up
              -- can commit a raise before this transaction ends.)
              v_first := greatest(lease._floor(false), v_base) + 1;
              IF v_first > epoch THEN
                UPDATE lease.leases l SET epoch = v_first WHERE l.key = v_key
                RETURNING l.epoch INTO epoch;
              END IF;
            END IF;
          ELSE
            -- Free or lapsed when read: lock, read the clock, decide again.
            -- (wait 0: NOWAIT, so no lock wait at all.)
            IF v_deadline IS NULL THEN
              SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires
                FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE NOWAIT;
            ELSE
              SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires
                FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
            END IF;
            IF NOT FOUND THEN
              RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- row removed: start over
            END IF;
            v_now := clock_timestamp();
            IF r_owner IS NOT NULL AND r_expires > v_now THEN
              -- Granted to someone (maybe this owner) since the unlocked read.
              RAISE EXCEPTION USING ERRCODE = 'LEASE';
            END IF;
            UPDATE lease.leases l
               SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,
                   expires_at = v_now + v_ttl, acquired_at = v_now, holder_role = v_role,
                   lapsed_owner = r_owner, lapsed_epoch = CASE WHEN r_owner IS NOT NULL THEN r_epoch END
             WHERE l.key = v_key
            RETURNING l.epoch, l.expires_at INTO epoch, expires_at;
          END IF;
          IF v_deadline IS NOT NULL OR NOT v_found THEN
            PERFORM set_config('lock_timeout', v_lt, true);  -- only where it was set above
          END IF;
          acquired := true;
        EXCEPTION
          WHEN SQLSTATE 'LEASE' THEN
            -- The lock, if taken, is gone with the subtransaction. Read again.
            CONTINUE;
          WHEN lock_not_available THEN
            -- Another transaction keeps the key's row (or its first grant)
            -- locked longer than the wait allows.
            IF v_deadline IS NULL THEN
              -- wait 0: the NOWAIT row lock, or a first grant's insertion
              -- that waited 1 ms (for a concurrent first grant of the key,
              -- or for a short server lock: read again, twice).
              IF NOT v_found AND v_busy < 2 THEN
                v_busy := v_busy + 1;
                CONTINUE;
              END IF;
              acquired := false; epoch := NULL; expires_at := NULL;
              RETURN;
            END IF;
            IF clock_timestamp() >= v_deadline THEN
              RAISE EXCEPTION 'timeout'
                USING ERRCODE = '57014',
                      DETAIL = format('key %L stayed locked by another transaction for the whole wait of %s',
                                      v_key, wait);
            END IF;
            CONTINUE;
        END;
        PERFORM lease._changed('acquired', v_key, v_owner, epoch);
        RETURN;
      END IF;
    END IF;

    -- Denied: the key is held by another owner until r_expires (or no new
    -- grant is made before r_expires, the end of a grace).
    IF v_deadline IS NULL THEN
      acquired := false; epoch := NULL; expires_at := NULL;
      RETURN;
    END IF;
    v_now := clock_timestamp();
    IF v_now >= v_deadline THEN
      IF v_in_grace THEN
        RAISE EXCEPTION 'timeout'
          USING ERRCODE = '57014',
                DETAIL = format('no new grant of key %L during the grace after a timeline change (promotion), which outlasts the wait of %s; lease.status() shows grace_until',
                                v_key, wait);
      END IF;
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

CREATE OR REPLACE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval,
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
  r_role    text;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch),
    lease._duration_violation('ttl', ttl, true),
    CASE WHEN ttl IS NOT NULL AND isfinite(ttl)
          AND extract(epoch FROM ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour'))
         THEN lease._ttl_violation(ttl, interval '0') END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.renew');
  END IF;
  v_ttl := lease._seconds(ttl);

  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, v_now);
    IF status = 'ok' AND r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role) THEN
      status := 'not_owner';  -- the owner string and epoch, but not the grant's role
    END IF;
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
  -- Durability as in lease._changed, but no notification (a renewal wakes nobody).
  IF current_setting('synchronous_commit') IN ('off', 'local') THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  RETURN;
END
$$;

CREATE OR REPLACE FUNCTION lease.release(key text, owner text, epoch bigint, OUT status text)
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
  r_role    text;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch)]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.release');
  END IF;

  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    v_now := clock_timestamp();
    status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, v_now);
    IF status = 'ok' AND r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role) THEN
      status := 'not_owner';
    END IF;
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    UPDATE lease.leases l SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now, holder_role = NULL
     WHERE l.key = v_key;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;
  END;
  PERFORM lease._changed('released', v_key, v_owner, v_epoch);
  RETURN;
END
$$;

-- fence: as in 0.1.0, plus the role check: another role presenting the
-- holder's owner string and epoch is refused (55000 not_owner), so it cannot
-- hold a fence open and make the holder's renewals wait. (A failed fence keeps
-- no lock: its error aborts the caller's transaction, which releases it.)
CREATE OR REPLACE FUNCTION lease.fence(key text, owner text, epoch bigint)
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
  r_role    text;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._epoch_violation(v_epoch)]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.fence');
  END IF;
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
    FROM lease.leases l WHERE l.key = v_key FOR SHARE;
  v_status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, clock_timestamp());
  IF v_status = 'ok' AND r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role) THEN
    v_status := 'not_owner';
  END IF;
  IF v_status <> 'ok' THEN
    RAISE EXCEPTION '%', v_status
      USING ERRCODE = '55000',
            DETAIL = format('key %L: owner %L with epoch %s is not the current holder (current epoch %s)',
                            v_key, v_owner, v_epoch, coalesce(r_epoch::text, 'none'));
  END IF;
  RETURN r_expires;
END
$$;

CREATE OR REPLACE FUNCTION lease.force_release(key text,
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
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.force_release');
  END IF;
  released := false;
  BEGIN
    SELECT l.owner, l.epoch INTO r_owner, r_epoch
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    epoch := r_epoch;
    IF r_owner IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- never leased, or already free
    END IF;
    UPDATE lease.leases l
       SET owner = NULL, epoch = l.epoch + 1, expires_at = clock_timestamp(), holder_role = NULL
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

-- cleanup as in 0.2.0, with free_for checked against the timestamptz range,
-- the read-only check, and a floor that is the maximum of the floor rows.
CREATE OR REPLACE FUNCTION lease.cleanup(free_for interval, max_rows integer DEFAULT 10000,
                              OUT removed bigint, OUT epoch_floor bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_now   timestamptz;
  v_limit integer := max_rows;
  v_max   bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._duration_violation('free_for', free_for, false),
    lease._free_for_violation(free_for),
    CASE WHEN v_limit IS NULL THEN 'max_rows must not be NULL'
         WHEN v_limit < 1 THEN 'max_rows must be at least 1' END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.cleanup');
  END IF;

  -- The floor rows' locks serialize clean-ups; first grants only read them
  -- (under REPEATABLE READ and SERIALIZABLE with FOR SHARE).
  PERFORM FROM lease.epoch_floor f FOR UPDATE;
  SELECT coalesce(max(f.floor), 0) INTO epoch_floor FROM lease.epoch_floor f;
  IF NOT EXISTS (SELECT 1 FROM lease.epoch_floor) THEN
    INSERT INTO lease.epoch_floor (floor) VALUES (0);  -- removed by hand
  END IF;
  v_now := clock_timestamp();

  WITH victims AS (
    SELECT l.key FROM lease.leases l
     WHERE (l.owner IS NULL OR l.expires_at <= v_now)
       AND l.expires_at <= v_now - lease._seconds(free_for)
     ORDER BY l.expires_at
     LIMIT v_limit
     FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM lease.leases l USING victims v
     WHERE l.key = v.key
    RETURNING l.epoch
  )
  SELECT count(*), max(g.epoch) INTO removed, v_max FROM gone g;

  -- The deletions and the floor commit together (no forcing needed: see 0.2.0).
  IF v_max > epoch_floor THEN
    UPDATE lease.epoch_floor f SET floor = v_max;
    epoch_floor := v_max;
  END IF;
END
$$;

-- Operators only (EXECUTE revoked from PUBLIC). Sets the maximum ttl that
-- acquire and renew accept (NULL: leave it) and returns the setting and the
-- promotion grace it implies now. Lowering max_ttl keeps the higher value as
-- the grace for that higher value's duration, since grants made under it
-- may still be believed.
CREATE FUNCTION lease.configure(max_ttl interval DEFAULT NULL,
                                OUT configured_max_ttl interval, OUT promotion_grace interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_max   interval := configure.max_ttl;
  v_grace interval;
BEGIN
  IF v_max IS NOT NULL THEN
    PERFORM lease._raise_invalid(ARRAY[
      CASE WHEN NOT isfinite(v_max) THEN 'max_ttl must be finite'
           WHEN extract(epoch FROM v_max) <= 0 THEN 'max_ttl must be positive'
           WHEN extract(epoch FROM v_max) > extract(epoch FROM interval '100 years')
             THEN 'max_ttl must be at most 100 years' END]);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.configure');
  END IF;
  IF v_max IS NOT NULL THEN
    v_grace := lease._grace();
    v_max := lease._seconds(v_max);
    INSERT INTO lease.settings AS s (max_ttl, prev_max_ttl, prev_until)
      VALUES (v_max,
              CASE WHEN v_grace > v_max THEN v_grace END,
              CASE WHEN v_grace > v_max THEN clock_timestamp() + v_grace END)
      ON CONFLICT (singleton) DO UPDATE
        SET max_ttl = excluded.max_ttl,
            prev_max_ttl = CASE WHEN v_grace > excluded.max_ttl THEN v_grace END,
            prev_until = CASE WHEN v_grace > excluded.max_ttl THEN clock_timestamp() + v_grace END;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
      PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
  END IF;
  configured_max_ttl := lease._max_ttl();
  promotion_grace := lease._grace();
END
$$;

-- Every role: the settings and the recorded timeline state (what a grant path
-- last saw; it does not read the server's timeline, so it also answers on a
-- standby).
CREATE FUNCTION lease.status(OUT max_ttl interval, OUT promotion_grace interval,
                             OUT timeline bigint, OUT era bigint, OUT grace_until timestamptz,
                             OUT epoch_floor bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT lease._max_ttl(), lease._grace(), t.timeline, t.era, t.grace_until,
         (SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f)
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (SELECT * FROM lease.timeline_state s ORDER BY s.era DESC, s.timeline DESC LIMIT 1) t ON true
$$;

-- lease.listen(key): registers this backend as waiting for notifications of
-- key ('*': of every key), for pg_lease.notify = 'waiters' (see
-- /work/plan/LISTEN-API.md and SEMANTICS section 11). Call it in a
-- transaction of its own (autocommit), then LISTEN pg_lease, then read the
-- key's state: listen locks the key's row FOR SHARE until its transaction
-- ends, so a change in flight (past its decision whether to notify) commits
-- before listen returns, and any later change sees the committed
-- registration. Also drops the registrations of backends that are gone.
CREATE FUNCTION lease.listen(key text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key;
BEGIN
  IF v_key IS DISTINCT FROM '*' THEN
    PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.listen');
  END IF;
  DELETE FROM lease.listeners w
   WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = w.pid);
  INSERT INTO lease.listeners AS w (pid, key, since)
    VALUES (pg_backend_pid(), v_key, clock_timestamp())
    ON CONFLICT ON CONSTRAINT listeners_pkey DO NOTHING;
  IF v_key <> '*' THEN
    PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE;
  END IF;
END
$$;

-- lease.unlisten(key): drops this backend's registration for key ('*': all of
-- this backend's registrations). Returns how many were dropped.
CREATE FUNCTION lease.unlisten(key text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key;
  v_n   integer;
BEGIN
  IF v_key IS DISTINCT FROM '*' THEN
    PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.unlisten');
  END IF;
  DELETE FROM lease.listeners w
   WHERE w.pid = pg_backend_pid() AND (v_key = '*' OR w.key = v_key);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION lease.version()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.3.0'::text $$;

-- ---------------------------------------------------------------------------
-- Dump: the state tables are configuration tables, so pg_dump keeps their
-- rows (only inside CREATE/ALTER EXTENSION; a schema-only install is dumped
-- like any schema).
-- ---------------------------------------------------------------------------
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
              WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.classid = 'pg_catalog.pg_namespace'::pg_catalog.regclass
                AND d.objid = 'lease'::pg_catalog.regnamespace
                AND e.extname = 'pg_lease' AND d.deptype = 'e') THEN
    PERFORM pg_catalog.pg_extension_config_dump('lease.leases', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.epoch_floor', 'WHERE floor > 0');
    PERFORM pg_catalog.pg_extension_config_dump('lease.timeline_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.settings', '');
  END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- Ownership and privileges, reset. Everything in schema lease belongs to the
-- schema's owner (the installer), whoever runs this update. Then every ACL is
-- emptied of every grantee but the owner (PUBLIC included), whatever default
-- privileges or earlier GRANTs put there, and the intended privileges are
-- granted again: USAGE on the schema and EXECUTE on the API to PUBLIC; the
-- tables, the internal helpers and the operator functions (force_release,
-- cleanup, configure) to the owner only.
-- ---------------------------------------------------------------------------
DO $$
DECLARE
  v_owner oid;
  v_name  text;
  r       record;
  g       record;
BEGIN
  SELECT n.nspowner INTO STRICT v_owner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'lease';
  v_name := pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(v_owner));

  FOR r IN
    SELECT 'TABLE' AS kind, format('%s', c.oid::pg_catalog.regclass) AS obj, c.relowner AS owner, c.relacl AS acl
      FROM pg_catalog.pg_class c
     WHERE c.relnamespace = 'lease'::pg_catalog.regnamespace AND c.relkind IN ('r', 'p')
    UNION ALL
    SELECT 'FUNCTION', format('%s', p.oid::pg_catalog.regprocedure), p.proowner, p.proacl
      FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'lease'::pg_catalog.regnamespace
    UNION ALL
    SELECT 'SCHEMA', 'lease', n.nspowner, n.nspacl
      FROM pg_catalog.pg_namespace n WHERE n.nspname = 'lease'
  LOOP
    IF r.owner <> v_owner THEN
      EXECUTE format('ALTER %s %s OWNER TO %s', r.kind, r.obj, v_name);
    END IF;
    EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC', r.kind, r.obj);
    FOR g IN
      SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(r.acl) a
       WHERE a.grantee <> 0 AND a.grantee <> v_owner AND a.grantee <> r.owner
    LOOP
      EXECUTE format('REVOKE ALL ON %s %s FROM %s CASCADE', r.kind, r.obj,
                     pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)));
    END LOOP;
    -- The owner keeps (or gets back) every privilege on its own objects.
    EXECUTE format('GRANT ALL ON %s %s TO %s', r.kind, r.obj, v_name);
  END LOOP;
END
$$;

GRANT USAGE ON SCHEMA lease TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.list() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.status() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.listen(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.unlisten(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.version() TO PUBLIC;

-- pg_lease 0.5.0: time-bounded ownership of named resources, kept in
-- PostgreSQL, that lapses unless renewed and carries a monotonic fencing epoch.
--
-- This file is the whole extension as of 0.5.0: a fresh install runs it alone.
-- The update scripts (pg_lease--X--0.5.0.sql) are generated from it by
-- hack/gensql: they run the state changes of sql/update/*.sql, then the part of
-- this file between @shared-begin and @shared-end. After editing either, run
-- `go run ./hack/gensql`; a test fails while the committed scripts differ.
--
-- Pure SQL and PL/pgSQL: no C, no background worker, no advisory lock. The
-- behaviour contract is specs/SEMANTICS.md; the invariants are in
-- specs/INVARIANTS.md. Every function follows these rules:
--
--  * Time authority is the server: "now" is clock_timestamp(), read once per
--    decision, after the row lock that decision needs is held. No function
--    accepts a client timestamp.
--  * Lazy expiry: a row is HELD while owner IS NOT NULL AND expires_at > now.
--    Nothing deletes or rewrites a row because time passed.
--  * Lock discipline: a call that changes nothing keeps no row lock. Each
--    locking step runs in a block with an EXCEPTION clause (a subtransaction).
--    When the decision is "no change", the block raises the private SQLSTATE
--    'LEASE', which rolls back the subtransaction and its row lock.
--  * Durability: a call that changes a lease makes its commit durable, even
--    when the session runs with synchronous_commit = off or local.
--  * Every error fails closed: nothing changes. Bad input is invalid_input
--    (22023) with a DETAIL naming every violated rule.
--  * Script safety: this script pins search_path first, and every statement
--    it runs at install time names pg_catalog's functions and operators in
--    full. Another role's objects in the installer's schemas are never called.

\echo Use "CREATE EXTENSION pg_lease" to load this file. \quit

-- CREATE EXTENSION sets search_path to the extension's schema for the script
-- and restores it afterwards. A local setting made here is undone with it.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- ---------------------------------------------------------------------------
-- 1. State (a fresh install only; sql/update/*.sql bring older versions here)
-- ---------------------------------------------------------------------------

-- The schema is created here, not by the control file, so that it belongs to
-- the extension and DROP EXTENSION removes it with every lease row.
CREATE SCHEMA lease;
COMMENT ON SCHEMA lease IS 'pg_lease: time-bounded leases with fencing epochs';
-- Everything belongs to the role that installed pg_lease. For a trusted
-- install by a non-superuser that is the installer, not the bootstrap
-- superuser, so SECURITY DEFINER functions have no more privilege than it.
-- Section 5 gives every other object to the schema's owner.
ALTER SCHEMA lease OWNER TO @extowner@;

-- One row per key that has ever been granted (and not removed by cleanup).
--   HELD:   owner IS NOT NULL AND expires_at >  now   (expires_at: end of grant)
--   LAPSED: owner IS NOT NULL AND expires_at <= now   (owner: the former holder)
--   FREE:   owner IS NULL                             (expires_at: release time)
-- epoch is the key's fencing counter: the epoch of the current or last grant,
-- or, after a release, one more than the released grant's epoch. It never
-- decreases. lapsed_owner and lapsed_epoch name the grant that lapsed and was
-- taken over by the current (or last) one, so that its former holder is told
-- "lapsed" rather than "not_owner". holder_role is the session_user of the
-- grant (NULL: free, or granted before 0.3.0). Only non-indexed columns change
-- after insertion, and pages keep free space, so renewals are HOT updates.
CREATE TABLE lease.leases (
    key         text        NOT NULL,
    owner       text,
    epoch       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    lapsed_owner text,
    lapsed_epoch bigint,
    holder_role text,
    life        timestamptz,
    life_timeline bigint,
    CONSTRAINT leases_pkey PRIMARY KEY (key),
    CONSTRAINT leases_epoch_positive CHECK (epoch OPERATOR(pg_catalog.>=) 1)
) WITH (fillfactor = 50);
COMMENT ON TABLE lease.leases IS
  'pg_lease internal state; use the lease.* functions, never this table';
COMMENT ON COLUMN lease.leases.holder_role IS
  'pg_lease internal: session_user of the grant (NULL: granted before 0.3.0, or free)';
COMMENT ON COLUMN lease.leases.life IS
  'pg_lease internal: postmaster start of the server life whose timeline record the last grant or renewal of this row found current';
COMMENT ON COLUMN lease.leases.life_timeline IS
  'pg_lease internal: the WAL timeline of that grant or renewal (one postmaster may write on two: a crash restart into recovery, then a promotion)';

-- cleanup removes the rows of keys free for long, and first raises this floor
-- to the highest epoch it removes. A key's first grant is above the floor, so
-- a key that comes back never repeats an epoch. No primary key: a restore adds
-- the dumped row beside the one made here, and readers take the maximum.
CREATE TABLE lease.epoch_floor (
    singleton boolean NOT NULL DEFAULT true CHECK (singleton),
    floor     bigint  NOT NULL DEFAULT 0 CHECK (floor OPERATOR(pg_catalog.>=) 0)
);
COMMENT ON TABLE lease.epoch_floor IS
  'pg_lease internal: every key''s first grant carries an epoch above floor';
INSERT INTO lease.epoch_floor DEFAULT VALUES;

-- The WAL timeline and the postmaster start last seen by a grant path or a
-- renewal, its epoch era and the restarts within that era. Epochs of era e
-- after r restarts are above e * 2^40 + r * 2^24. A timeline change (a
-- promotion) moves to a higher era; another postmaster on the same timeline
-- (a restart, which may have lost the last commits) to the next restart of
-- the era. A change is recorded by inserting a row, never by updating one,
-- so that recording it locks nothing another session waits for: the state is
-- the row with the highest era and restarts (then the earliest grace_until,
-- then the latest start). started NULL: not known (a row of 0.4.0).
CREATE TABLE lease.timeline_state (
    timeline    bigint      NOT NULL,
    era         bigint      NOT NULL CHECK (era OPERATOR(pg_catalog.>=) 0 AND era OPERATOR(pg_catalog.<) 8388607),
    grace_until timestamptz,
    started     timestamptz,
    restarts    integer     NOT NULL DEFAULT 0
                CHECK (restarts OPERATOR(pg_catalog.>=) 0 AND restarts OPERATOR(pg_catalog.<) 65536)
);
COMMENT ON TABLE lease.timeline_state IS
  'pg_lease internal: the WAL timeline and postmaster start last seen, its epoch era and restarts, no new grant before grace_until';
-- (lease._timeline() inline: the functions are created below.)
INSERT INTO lease.timeline_state (timeline, era, started)
  VALUES ((('x'::pg_catalog.text OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)
           )::pg_catalog.bit(32))::pg_catalog.int8, 0, pg_catalog.pg_postmaster_start_time());

-- Sessions waiting for notifications of a key (lease.listen). UNLOGGED: the
-- rows belong to live backends, which a crash ends anyway; never dumped.
CREATE UNLOGGED TABLE lease.listeners (
    pid   integer     NOT NULL,
    key   text        NOT NULL,
    since timestamptz NOT NULL,
    CONSTRAINT listeners_pkey PRIMARY KEY (key, pid)
);
COMMENT ON TABLE lease.listeners IS
  'pg_lease internal: backends waiting for notifications of a key (''*'': every key)';
-- A session's registrations (the per-session bound) and the backends that
-- registered (clean-up of those that are gone), read through this index.
CREATE INDEX listeners_pid ON lease.listeners (pid);

-- Operator settings (lease.configure). No row means the defaults.
CREATE TABLE lease.settings (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_ttl      interval NOT NULL,
    prev_max_ttl interval,
    prev_until   timestamptz,
    promotion    text CHECK (promotion OPERATOR(pg_catalog.=) ANY (ARRAY['any', 'synchronous']::pg_catalog.text[]))
);
COMMENT ON TABLE lease.settings IS
  'pg_lease internal: operator settings (lease.configure); no row means the defaults';

-- ---------------------------------------------------------------------------
-- Leadership history (0.4.0): every grant, takeover, release, forced release
-- and promotion grace of a key, recorded by the functions that make them, in
-- the same transaction, under the key's row lock. Each key keeps the last
-- history_rows events of each role that made events of it (actor;
-- lease.configure_history, default 100): a write trims its own role's oldest
-- event of the key, so one role never removes another's, and storage is
-- bounded per key and role. Clean-up removes a key's history with the key
-- (no foreign key: its check would cost every write). Read through
-- lease.history and lease.health.
-- ---------------------------------------------------------------------------

CREATE TABLE lease.history (
    key            text        NOT NULL,
    seq            bigint      NOT NULL,
    at             timestamptz NOT NULL,
    event          text        NOT NULL,
    owner          text,
    holder_role    text,
    epoch          bigint,
    actor          text        NOT NULL,
    previous_owner text,
    previous_epoch bigint,
    vacant_since   timestamptz,
    ttl            interval,
    grants         bigint      NOT NULL,
    detail         text,
    actor_seq      bigint      NOT NULL,
    trimmed_at     timestamptz,
    CONSTRAINT history_pkey PRIMARY KEY (key, seq),
    CONSTRAINT history_event_check CHECK (event OPERATOR(pg_catalog.=) ANY (ARRAY['acquired', 'taken_over', 'handed_over', 'released',
                                                    'force_released', 'promotion_grace']::pg_catalog.text[]))
);
COMMENT ON TABLE lease.history IS
  'pg_lease internal: the last events of each key and role (lease.history, lease.health; retention: lease.configure_history)';
COMMENT ON COLUMN lease.history.actor_seq IS
  'pg_lease internal: numbers the events of this key made by this actor (the retention trims by it)';
COMMENT ON COLUMN lease.history.trimmed_at IS
  'pg_lease internal: the time of the newest event of this key that retention removed before this one (NULL: none)';
-- An actor's events of a key, newest last: its retention.
CREATE INDEX history_actor ON lease.history (key, actor, actor_seq);

-- No row: the default retention, 100 events per key and role.
CREATE TABLE lease.history_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_rows integer NOT NULL CHECK (keep_rows OPERATOR(pg_catalog.>=) 0 AND keep_rows OPERATOR(pg_catalog.<=) 100000)
);
COMMENT ON TABLE lease.history_settings IS
  'pg_lease internal: history retention (lease.configure_history); no row means 100 events per key and role';

-- Candidates of a key for a handover on release (lease.candidate). A
-- registration is bound to session_user and to the registering backend: it is
-- gone when that backend's connection ends or its ttl passes unrenewed. Each
-- role has its own registrations: the same owner string registered by two
-- roles is two rows, and a release only chooses among the roles it may act
-- as. UNLOGGED: the rows belong to live backends, which a crash or a failover
-- ends anyway; never dumped.
CREATE UNLOGGED TABLE lease.candidates (
    key           text        NOT NULL,
    owner         text        NOT NULL,
    role          text        NOT NULL,
    pid           integer     NOT NULL,
    version       text,
    version_num   numeric[],
    version_pre   text COLLATE "C",
    priority      integer     NOT NULL,
    ready         boolean     NOT NULL,
    ttl           interval    NOT NULL,
    registered_at timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    CONSTRAINT candidates_pkey PRIMARY KEY (key, owner, role)
);
CREATE INDEX candidates_role ON lease.candidates (role);
COMMENT ON TABLE lease.candidates IS
  'pg_lease internal: candidates of a key for a handover on release (lease.candidate)';

-- Strategies, per key and role: a role's strategy governs only the releases
-- made by that role (session_user). No row: any (the waiters race).
CREATE TABLE lease.strategies (
    key      text        NOT NULL,
    strategy text        NOT NULL CHECK (strategy OPERATOR(pg_catalog.=) ANY (ARRAY['priority', 'newest_version', 'oldest_version']::pg_catalog.text[])),
    role     text        NOT NULL,
    set_at   timestamptz NOT NULL,
    CONSTRAINT strategies_pkey PRIMARY KEY (key, role)
);
CREATE INDEX strategies_role ON lease.strategies (role);
COMMENT ON TABLE lease.strategies IS
  'pg_lease internal: who a release by role hands a key to (lease.set_strategy); no row means any';

-- One row per role that registered a candidate or set a strategy: a new
-- registration or strategy updates its role's row before counting that
-- role's rows, so concurrent transactions of one role cannot each pass the
-- bound (lease._max_candidates). Only that role's calls lock its row.
CREATE UNLOGGED TABLE lease.registrars (
    role text        NOT NULL,
    at   timestamptz NOT NULL,
    CONSTRAINT registrars_pkey PRIMARY KEY (role)
);
COMMENT ON TABLE lease.registrars IS
  'pg_lease internal: a row per role, locked by its new candidate registrations and strategies (their bound)';

-- @shared-begin: every install and update script runs this part as written.

-- CREATE EXTENSION without SCHEMA records pg_lease in the first schema of the
-- search_path ("$user" first by default). Whoever owns that schema could drop
-- pg_lease with every lease (DROP SCHEMA ... CASCADE): refuse a schema owned
-- by a role other than the extension's owner, a role it was granted, a
-- superuser or the database's owner (a superuser is not taken as a member
-- of every role here). (A schema-only install has no
-- extension row: nothing to check.)
DO $check$
DECLARE
  v_nsp   text;
  v_owner oid;
  v_ext   oid;
BEGIN
  SELECT n.nspname, n.nspowner, e.extowner INTO v_nsp, v_owner, v_ext
    FROM pg_catalog.pg_extension e
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
   WHERE e.extname OPERATOR(pg_catalog.=) 'pg_lease';
  IF FOUND AND NOT (v_owner OPERATOR(pg_catalog.=) v_ext
                    OR v_owner OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid
                    OR EXISTS (SELECT FROM pg_catalog.pg_auth_members m
                                WHERE m.roleid OPERATOR(pg_catalog.=) v_owner AND m.member OPERATOR(pg_catalog.=) v_ext)
                    OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) v_owner)) THEN
    RAISE EXCEPTION 'pg_lease would belong to schema % of role %, which could drop it',
                    pg_catalog.quote_ident(v_nsp), pg_catalog.pg_get_userbyid(v_owner)
      USING ERRCODE := '42501',
            DETAIL := 'CREATE EXTENSION without SCHEMA uses the first schema of search_path; that schema belongs to another role.',
            HINT := 'Use pglease install (leaseadmin.InstallExtension), or CREATE EXTENSION pg_lease SCHEMA pg_catalog.';
  END IF;
END
$check$;

-- ---------------------------------------------------------------------------
-- 2. Helpers. Names start with an underscore; EXECUTE is revoked from PUBLIC.
-- They carry no SET clause, so the planner can inline the SQL ones; their
-- callers, the API functions below, pin search_path.
-- ---------------------------------------------------------------------------

-- 2a. Input validation. Each returns NULL when the value is valid, else a
-- sentence naming the violated rule. Callers collect every violation into the
-- DETAIL of one invalid_input (22023) error.

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

-- A duration (ttl or wait) is measured in seconds: months count 30 days and
-- days 24 hours, whatever the session's time zone, so a lease always lasts
-- exactly the duration given. positive: ttl (> 0); otherwise wait (>= 0).
-- The last check keeps now + v inside timestamptz's range with a second to
-- spare, so computing the expiry or the deadline cannot overflow.
CREATE OR REPLACE FUNCTION lease._duration_violation(what text, v interval, positive boolean)
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

CREATE OR REPLACE FUNCTION lease._epoch_violation(v bigint)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
    WHEN v IS NULL THEN 'epoch must not be NULL'
    WHEN v < 1 THEN 'epoch must be at least 1'
  END
$$;

-- ttl against the configured maximum, and ttl + wait against the timestamptz
-- range (a blocking acquire computes its expiry after the wait). NULL when
-- either is NULL (their own checks report it).
CREATE OR REPLACE FUNCTION lease._ttl_violation(ttl interval, wait interval)
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
CREATE OR REPLACE FUNCTION lease._free_for_violation(v interval)
RETURNS text LANGUAGE sql VOLATILE
AS $$
  SELECT CASE
    WHEN v IS NULL OR NOT isfinite(v) THEN NULL
    WHEN extract(epoch FROM clock_timestamp()) - extract(epoch FROM v)
         <= extract(epoch FROM timestamptz '4713-11-24 00:00:00+00 BC') + 1
      THEN 'free_for is too large: server time - free_for would underflow timestamptz'
  END
$$;

CREATE OR REPLACE FUNCTION lease._raise_invalid(violations text[])
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

CREATE OR REPLACE FUNCTION lease._raise_read_only(fn text)
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

-- The duration actually applied: the same number of seconds, as an interval
-- with no day or month part (time-zone independent arithmetic).
CREATE OR REPLACE FUNCTION lease._seconds(v interval)
RETURNS interval LANGUAGE sql IMMUTABLE
AS $$ SELECT make_interval(secs => extract(epoch FROM v)::double precision) $$;

-- lock_timeout for acquire's lock waits: what is left of the wait, at least
-- 1 ms, at most lock_timeout's maximum. deadline NULL (wait 0): 100 ms, the
-- bound of a first grant's insertion. It waits only for a concurrent first
-- grant of the key or for the server's own short locks (extending the table
-- or an index), which must not deny a free key under load.
CREATE OR REPLACE FUNCTION lease._lock_timeout(deadline timestamptz)
RETURNS text LANGUAGE sql VOLATILE
AS $$
  SELECT CASE WHEN deadline IS NULL THEN '100'
    ELSE least(2147483647, greatest(1, ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000)))::bigint::text
  END
$$;

-- 2b. Settings, epochs and timelines.

-- (The helpers that read a table are PL/pgSQL, not SQL: a SQL function with a
-- subquery is not inlined and would be planned again at every call.)
CREATE OR REPLACE FUNCTION lease._max_ttl()
RETURNS interval LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour');
END
$$;

-- The grace a timeline change seen now imposes. promotion 'any' (the
-- default): max_ttl, since a promoted standby may lack any grant the old
-- primary acknowledged. 'synchronous': 0, since the operator states that
-- only a standby holding every acknowledged commit can be promoted
-- (specs/FAILURE-MODEL.md lists the assumptions). Either way a higher grace
-- in force until prev_until wins (grants made under it may still be believed).
CREATE OR REPLACE FUNCTION lease._grace()
RETURNS interval LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RETURN coalesce((SELECT greatest(CASE WHEN s.promotion = 'synchronous' THEN interval '0' ELSE s.max_ttl END,
                                   CASE WHEN s.prev_until > clock_timestamp() THEN s.prev_max_ttl END)
                     FROM lease.settings s), interval '1 hour');
END
$$;

-- At grant and renewal time, under the row lock: the ttl against the max_ttl
-- in force now. A call checked before lease.configure lowered max_ttl may
-- have waited since (a blocking acquire, a renew behind a row lock); it must
-- not get the old ttl once the grace that covered it has moved on.
CREATE OR REPLACE FUNCTION lease._check_ttl_now(ttl interval)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_max interval := lease._max_ttl();
BEGIN
  IF extract(epoch FROM ttl) > extract(epoch FROM v_max) THEN
    PERFORM lease._raise_invalid(ARRAY['ttl must be at most max_ttl (' || trim_scale(extract(epoch FROM v_max))::text
                                       || ' s, set by lease.configure while this call waited)']);
  END IF;
END
$$;

-- The epoch of a key's first grant in era 0: one above the epoch floor.
CREATE OR REPLACE FUNCTION lease._first_epoch()
RETURNS bigint LANGUAGE sql STABLE
AS $$ SELECT coalesce(max(f.floor), 0) + 1 FROM lease.epoch_floor f $$;

-- The epoch floor. locked: under REPEATABLE READ or SERIALIZABLE, read the
-- rows with a lock, so a floor raised after the snapshot raises 40001
-- instead of being missed.
CREATE OR REPLACE FUNCTION lease._floor(locked boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF locked THEN
    PERFORM FROM lease.epoch_floor f FOR SHARE;
  END IF;
  RETURN (SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f);
END
$$;

-- The server's current WAL timeline. Raises 55000 on a standby.
CREATE OR REPLACE FUNCTION lease._timeline()
RETURNS bigint LANGUAGE sql VOLATILE
AS $$
  SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- An instant no earlier than the start of the server's timeline tl, when the
-- control file proves one: the latest checkpoint was made on tl, so it began
-- after tl did (a promotion requests one at once). Its time is whole seconds
-- rounded down: one second is added. NULL when the latest checkpoint is of an
-- earlier timeline (the first one after the promotion has not completed yet),
-- the function owner may not call pg_control_checkpoint(), or the read fails
-- (a torn read of the control file fails its CRC check): the caller then
-- measures from its clock, later, so also safe. Called once per change.
CREATE OR REPLACE FUNCTION lease._timeline_began(tl bigint)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_began timestamptz;
BEGIN
  IF NOT pg_catalog.has_function_privilege('pg_catalog.pg_control_checkpoint()', 'EXECUTE') THEN
    RETURN NULL;
  END IF;
  BEGIN
    SELECT c.checkpoint_time + interval '1 s' INTO v_began
      FROM pg_catalog.pg_control_checkpoint() c WHERE c.timeline_id = tl;
  EXCEPTION WHEN internal_error OR io_error OR data_corrupted THEN
    RETURN NULL;
  END;
  RETURN least(v_began, clock_timestamp());
END
$$;

-- Called on every grant path (free, lapsed or never-leased key) and by every
-- renewal, outside any subtransaction. Returns the epoch base (every epoch
-- granted now must exceed it: era * 2^40 + restarts * 2^24) and when the
-- grace after the last timeline change or restart ends. The common case, the
-- server's timeline and postmaster start both as recorded, is one read and
-- two comparisons. Otherwise this is the first call of a new server life,
-- and it moves to a higher base and starts the grace, by inserting a row:
--  * another timeline (a promotion, or a restore into another cluster): to
--    a higher era, by the timeline difference when the timeline grew (so
--    that two successive promotions cannot share an era), by one otherwise.
--    A new era is above every restart of the one before, so a standby that
--    missed restarts of its primary and is then promoted is above every
--    epoch they gave. When the timeline grew, the grace runs from when the
--    new timeline began, as the control file proves it
--    (lease._timeline_began), else from now: not from a first grant or
--    renewal made long after the promotion.
--  * the same timeline under another postmaster: a restart. A standby
--    restarted without standby.signal (ended without a promotion) cannot be
--    told from a restarted primary here, and may lack the primary's last
--    commits: to the next restart of the era (after 65535, the next era),
--    with the grace from the postmaster's start (when it started after the
--    recorded start; else, a clock or a cluster that cannot be placed, from
--    now).
--  * started not recorded (a row of 0.4.0): the start is recorded, with the
--    same base and no grace.
-- An insertion locks nothing that another session waits for, so a recording
-- left in an open transaction (a denied acquire's, a blocking acquire's)
-- never delays another key's call: until it commits, other calls record their
-- own rows, with the same base and their own (as late, so also safe) grace.
-- Renewals record too, so the grace never waits for the next handoff.
CREATE OR REPLACE FUNCTION lease._grant_context(OUT base bigint, OUT grace_until timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_tl       bigint := lease._timeline();
  v_started  timestamptz := pg_catalog.pg_postmaster_start_time();
  v_from     timestamptz;
  v_era      bigint;
  v_restarts integer := 0;
  s_tl       bigint;
  s_era      bigint;
  s_restarts integer;
  s_grace    timestamptz;
  s_started  timestamptz;
BEGIN
  SELECT t.timeline, t.era, t.restarts, t.grace_until, t.started INTO s_tl, s_era, s_restarts, s_grace, s_started
    FROM lease.timeline_state t
   ORDER BY t.era DESC, t.restarts DESC, t.grace_until ASC NULLS FIRST, t.timeline DESC, t.started DESC NULLS LAST
   LIMIT 1;
  IF NOT FOUND THEN
    -- The state rows were removed by hand: start above every epoch stored.
    SELECT greatest(coalesce(max(l.epoch), 0), lease._first_epoch()) >> 40 INTO s_era FROM lease.leases l;
    s_tl := NULL;
  ELSIF s_tl = v_tl AND s_started = v_started THEN
    base := (s_era << 40) + (s_restarts::bigint << 24);
    grace_until := s_grace;
    RETURN;
  ELSIF s_tl = v_tl AND s_started IS NULL THEN
    base := (s_era << 40) + (s_restarts::bigint << 24);
    grace_until := s_grace;
    INSERT INTO lease.timeline_state (timeline, era, restarts, grace_until, started)
      VALUES (v_tl, s_era, s_restarts, s_grace, v_started);
    RETURN;
  END IF;
  IF s_tl = v_tl AND s_restarts < 65535 THEN
    v_era := s_era;
    v_restarts := s_restarts + 1;
  ELSE
    v_era := s_era + CASE WHEN v_tl > s_tl THEN v_tl - s_tl ELSE 1 END;
  END IF;
  IF s_tl = v_tl THEN
    v_from := CASE WHEN v_started > s_started THEN v_started ELSE clock_timestamp() END;
  ELSE
    v_from := coalesce(CASE WHEN v_tl > s_tl THEN lease._timeline_began(v_tl) END, clock_timestamp());
  END IF;
  base := (v_era << 40) + (v_restarts::bigint << 24);
  grace_until := greatest(s_grace, v_from + lease._grace());
  INSERT INTO lease.timeline_state (timeline, era, restarts, grace_until, started)
    VALUES (v_tl, v_era, v_restarts, grace_until, v_started);
END
$$;

-- What started the grace of the state (for the history and the errors that
-- name it): a restart of the server when the state was entered on the
-- timeline of the state before it, else a timeline change. Read only when a
-- grace withheld a grant.
CREATE OR REPLACE FUNCTION lease._grace_cause()
RETURNS text LANGUAGE plpgsql STABLE
AS $$
DECLARE
  c_tl       bigint;
  c_era      bigint;
  c_restarts integer;
  c_started  timestamptz;
  p_tl       bigint;
BEGIN
  SELECT t.timeline, t.era, t.restarts, t.started INTO c_tl, c_era, c_restarts, c_started
    FROM lease.timeline_state t
   ORDER BY t.era DESC, t.restarts DESC, t.grace_until ASC NULLS FIRST, t.timeline DESC, t.started DESC NULLS LAST
   LIMIT 1;
  SELECT t.timeline INTO p_tl
    FROM lease.timeline_state t WHERE (t.era, t.restarts) < (c_era, c_restarts)
   ORDER BY t.era DESC, t.restarts DESC, t.grace_until ASC NULLS FIRST, t.timeline DESC, t.started DESC NULLS LAST
   LIMIT 1;
  IF p_tl = c_tl THEN
    RETURN format('a restart of the server without a promotion (timeline %s, postmaster started at %s)',
                  c_tl, c_started);
  END IF;
  RETURN 'a timeline change (promotion)';
END
$$;

-- 2c. Holders and changes.

-- Status of (owner, epoch) against a row read at server time now.
-- Precedence: not_owner (no row, free key, or another owner), then lapsed
-- (the caller held the key and that grant expired), then epoch_mismatch.
-- A holder whose grant lapsed and was then taken over is told lapsed, not
-- not_owner: the row remembers the grant that the takeover ended.
CREATE OR REPLACE FUNCTION lease._holder_status(found boolean, row_owner text, row_epoch bigint,
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

-- Whether session_user may act on a grant taken by holder_role: the same
-- role, a member of it, or a grant bound to no role (NULL, made before 0.3.0).
-- A dropped role's grant can only lapse.
-- (Callers test the common case, NULL or session_user itself, inline first.)
CREATE OR REPLACE FUNCTION lease._may_act(holder_role text)
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

-- Called after every change of a lease, inside the changing transaction.
--  * Durability: synchronous_commit off and local are raised to on for this
--    transaction, so the commit waits for the WAL flush and for the
--    configured synchronous standbys. A client never acts on a lost grant.
--  * Notification (pg_lease.notify): NOTIFY on channel pg_lease, delivered
--    only if the transaction commits. By default (unset, 'waiters', any
--    other value) only when a session registered with lease.listen for this
--    key or for '*': a NOTIFY takes a server-wide lock through its commit's
--    flush, so notifying nobody has a price. Under REPEATABLE READ and
--    SERIALIZABLE the transaction's snapshot may predate a registration,
--    so such a change always notifies. on/always/true/yes/1/t/y: always,
--    for listeners that do not register. off/false/no/0/f/n: never.
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
     AND current_setting('transaction_isolation') = 'read committed'
     AND NOT EXISTS (SELECT 1 FROM lease.listeners w WHERE w.key = _changed.key OR w.key = '*') THEN
    RETURN;
  END IF;
  PERFORM pg_notify('pg_lease', json_build_object(
    'event', event, 'key', key, 'owner', owner, 'epoch', epoch)::text);
END
$$;


-- Records one event of key k, made by session_user (the actor). Called only
-- by the functions that change the key's row, after the change and under its
-- row lock, so the key's events are numbered without gaps or races. is_grant:
-- the event begins a term (it counts in grants). Retention is per key and
-- actor: the write trims this actor's events of the key beyond keep_rows, so
-- no role's calls remove another role's events; only this key's rows, which
-- no other key's caller ever waits for. An actor's rows of a key are its last
-- actor_seqs (configure_history trims every key at once), so the trim looks
-- at a few index entries only: from keep_rows below the new row down 8 more
-- (a trim that raced configure_history may have left one). trimmed_at
-- carries the time of the newest event of the key removed so far.
CREATE OR REPLACE FUNCTION lease._record(k text, ev text, is_grant boolean, o text, r text, e bigint,
                              prev_owner text, prev_epoch bigint, vacant timestamptz,
                              t interval, why text, ts timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_actor text := session_user;
BEGIN
  -- One statement: the retention, the key's last event and the actor's last
  -- event of it (p); the actor's events beyond the retention (d); the new
  -- event. (The INSERT does not see d's deletions, nor needs to.)
  WITH p AS (
  SELECT coalesce((SELECT s.keep_rows FROM lease.history_settings s), 100) AS keep,
         coalesce(h.seq, 0) + 1 AS seq,
         coalesce(h.grants, 0) + CASE WHEN is_grant THEN 1 ELSE 0 END AS grants,
         h.trimmed_at,
         coalesce(a.actor_seq, 0) + 1 AS aseq
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (SELECT x.seq, x.grants, x.trimmed_at FROM lease.history x
                        WHERE x.key = k ORDER BY x.seq DESC LIMIT 1) h ON true
    LEFT JOIN LATERAL (SELECT x.actor_seq FROM lease.history x
                        WHERE x.key = k AND x.actor = v_actor ORDER BY x.actor_seq DESC LIMIT 1) a ON true
  ), d AS (
  DELETE FROM lease.history h
   WHERE h.key = k AND h.actor = v_actor
     AND h.actor_seq > (SELECT p.aseq - p.keep - 8 FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
     AND h.actor_seq <= (SELECT p.aseq - p.keep FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
  RETURNING h.at
  )
  INSERT INTO lease.history (key, seq, at, event, owner, holder_role, epoch, actor, previous_owner,
                           previous_epoch, vacant_since, ttl, grants, detail, actor_seq, trimmed_at)
  SELECT k, p.seq, ts, ev, o, r, e, v_actor, prev_owner, prev_epoch, vacant, t, p.grants, why,
       p.aseq, greatest(p.trimmed_at, (SELECT max(d.at) FROM d))
  FROM p
   WHERE p.keep > 0;
END
$$;

-- The role name r as a caller may see it in history and health: shown to
-- the role itself and to its members (superusers included), NULL to every
-- other role, as inspect and list show no role at all.
CREATE OR REPLACE FUNCTION lease._shown_role(r text)
RETURNS text LANGUAGE sql STABLE
AS $$
  SELECT CASE WHEN r = session_user::text OR lease._may_act(r) THEN r END
$$;

-- 2c'. Renewal: the parts lease.renew and lease.renew_many share.

-- Every violation of renew's arguments (NULL entries: none), for the DETAIL
-- of one invalid_input (22023). The full checks; see lease._renew_fast.
CREATE OR REPLACE FUNCTION lease._renew_violations(key text, owner text, epoch bigint, ttl interval)
RETURNS text[] LANGUAGE sql VOLATILE
AS $$
  SELECT ARRAY[
  lease._text_violation('key', key),
  lease._text_violation('owner', owner),
  lease._epoch_violation(epoch),
  lease._duration_violation('ttl', ttl, true),
  CASE WHEN ttl IS NOT NULL AND isfinite(ttl)
        AND extract(epoch FROM ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour'))
       THEN lease._ttl_violation(ttl, interval '0') END]
$$;

-- The validation fast path of renew: one inline test of the common case.
-- True only for arguments that pass every check of lease._renew_violations,
-- so renew skips those checks when it is true; false or NULL: run them.
-- max_ttl is the stored setting (NULL: the default, 1 hour). A ttl of at
-- most 100 years, at a clock before the year 294000, keeps server time + ttl
-- at least 270 years inside timestamptz's range. A SQL expression with no
-- subquery, so the planner inlines it into the caller's statement.
CREATE OR REPLACE FUNCTION lease._renew_fast(key text, owner text, epoch bigint, ttl interval, max_ttl interval)
RETURNS boolean LANGUAGE sql VOLATILE
AS $$
  SELECT key <> '' AND owner <> ''
   AND octet_length(key) <= 1024 AND octet_length(owner) <= 1024
   AND key !~ '[\x01-\x1f\x7f]' AND owner !~ '[\x01-\x1f\x7f]'
   AND epoch >= 1
   AND isfinite(ttl) AND extract(epoch FROM ttl) > 0
   AND extract(epoch FROM ttl) <= extract(epoch FROM coalesce(max_ttl, interval '1 hour'))
   AND extract(epoch FROM ttl) <= 3155760000
   AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
$$;

-- One key's renewal. Locks the key's row only when it names owner o under a
-- role session_user may act for (the caller's own grant, held or lapsed):
-- any other key (never leased, free, another owner's, another role's) is
-- decided from a read that takes no lock, so a refused renewal never makes
-- another role wait. Decides the caller's status at server time now (NULL:
-- the clock read after the lock), and when it is ok sets the expiry to now +
-- ttl. locked: this call took the key's row lock. Callers run it in a block
-- with an EXCEPTION clause and raise 'LEASE' when the status is not ok, so a
-- refused key keeps no row lock. Writes no history and sends no
-- notification (a renewal wakes nobody). The UPDATE, a statement begun after
-- the lock, reads the max_ttl in force: lease.configure may have lowered it
-- while this call waited. A ttl above it raises invalid_input, which undoes
-- the UPDATE.
CREATE OR REPLACE FUNCTION lease._renew_key(k text, o text, e bigint, ttl interval, now timestamptz,
                               OUT status text, OUT expires_at timestamptz, OUT locked boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_lowner  text;
  r_lepoch  bigint;
  r_role    text;
  v_found   boolean;
  v_max     interval;
BEGIN
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
  INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
  FROM lease.leases l
   WHERE l.key = k AND l.owner = o
   AND (l.holder_role IS NULL OR l.holder_role = session_user::text OR lease._may_act(l.holder_role))
   FOR NO KEY UPDATE;
  locked := FOUND;
  v_found := locked;
  IF NOT locked THEN
  -- Not the caller's grant when read: its status, without a lock.
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
    FROM lease.leases l WHERE l.key = k;
  v_found := FOUND;
  IF v_found AND r_owner = o AND (r_role IS NULL OR r_role = session_user::text OR lease._may_act(r_role)) THEN
    -- Granted to the caller since the first read: lock it, read it again.
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
      FROM lease.leases l WHERE l.key = k FOR NO KEY UPDATE;
    v_found := FOUND;
    locked := FOUND;
  END IF;
  END IF;
  now := coalesce(now, clock_timestamp());
  status := lease._holder_status(v_found, r_owner, r_epoch, r_expires, r_lowner, r_lepoch, o, e, now);
  IF status = 'ok' AND (NOT locked
                      OR r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role)) THEN
  status := 'not_owner';  -- the owner string and epoch, but not the grant's role
  END IF;
  IF status <> 'ok' THEN
  RETURN;
  END IF;
  UPDATE lease.leases l SET expires_at = now + ttl
   WHERE l.key = k
  RETURNING l.expires_at, (SELECT s.max_ttl FROM lease.settings s) INTO expires_at, v_max;
  IF extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
  PERFORM lease._check_ttl_now(ttl);
  END IF;
END
$$;

-- 2d. Handover (specs/SEMANTICS.md section 16). A candidate registers for a key
-- with a version, a priority and readiness; the strategy that the releasing
-- role set on the key says which ready candidate its release grants the key
-- to, epoch + 1, in the release's own transaction, among the candidates of
-- roles it may act as (itself, or a role it is a member of). No strategy, or
-- no such ready candidate: the release frees the key.

-- A version as Kubernetes parses it (semver, tolerant): an optional v, one to
-- three numbers, an optional pre-release and build. Returns the numbers
-- (missing ones are 0) and a pre-release sort key (NULL: a release, which
-- sorts above every pre-release). NULL numbers: not a version.
CREATE OR REPLACE FUNCTION lease._version_parts(v text, OUT num numeric[], OUT pre text)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
  m text[];
  p text;
BEGIN
  m := regexp_match(v, '^\s*[vV]?(\d{1,30})(?:\.(\d{1,30}))?(?:\.(\d{1,30}))?(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?\s*$');
  IF m IS NULL THEN
  RETURN;
  END IF;
  num := ARRAY[m[1]::numeric, coalesce(m[2], '0')::numeric, coalesce(m[3], '0')::numeric];
  IF m[4] IS NOT NULL THEN
  -- Numeric identifiers sort below alphanumeric ones and by value.
  SELECT string_agg(CASE WHEN i ~ '^\d+$' THEN '0' || lpad(ltrim(i, '0'), 30, '0') ELSE '1' || i END,
                    '.' ORDER BY n)
    INTO p
    FROM unnest(string_to_array(m[4], '.')) WITH ORDINALITY AS t(i, n);
  pre := p;
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION lease._version_violation(v text)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
  WHEN v IS NULL THEN NULL
  WHEN octet_length(v) > 256 THEN 'version must be at most 256 bytes'
  WHEN (lease._version_parts(v)).num IS NULL
    THEN 'version must be a semantic version such as 1.31.0 or v1.31.0-rc.1'
  END
$$;

CREATE OR REPLACE FUNCTION lease._strategy_violation(v text)
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE
  WHEN v IS NULL THEN 'strategy must not be NULL'
  WHEN v NOT IN ('any', 'priority', 'newest_version', 'oldest_version')
    THEN 'strategy must be one of any, priority, newest_version, oldest_version'
  END
$$;

-- Registrations a role may hold in all (every key), and keys it may set a
-- strategy on. A registration or strategy that would exceed it is refused
-- with 54000. A sharded controller of N shards under one role holds about
-- N registrations (one runner-up per shard), up to twice that while its
-- members change, and N strategies: 8192 covers pkg/shard's most shards
-- (4096) and 10 replicas of 1024 shards with room.
CREATE OR REPLACE FUNCTION lease._max_candidates()
RETURNS integer LANGUAGE sql IMMUTABLE
AS $$ SELECT 8192 $$;

-- Takes session_user's row of lease.registrars, until the transaction ends:
-- the count of its registrations (or strategies) that follows sees every
-- other transaction of the role that added one. Under REPEATABLE READ a
-- concurrent one that committed first makes this 40001.
CREATE OR REPLACE FUNCTION lease._lock_registrar()
RETURNS void LANGUAGE sql VOLATILE
AS $$
  INSERT INTO lease.registrars AS q (role, at) VALUES (session_user, clock_timestamp())
  ON CONFLICT ON CONSTRAINT registrars_pkey DO UPDATE SET at = excluded.at
$$;

-- Whether a release by session_user may hand a key to a candidate of role
-- r: r is session_user or a role it was granted, directly or through other
-- grants (pg_auth_members). Not pg_has_role: a superuser is a member of
-- every role without any grant, and its releases must not choose among
-- every role's candidates.
CREATE OR REPLACE FUNCTION lease._granted(r text)
RETURNS boolean LANGUAGE sql STABLE
AS $$
  WITH RECURSIVE m(oid) AS (
  SELECT a.oid FROM pg_catalog.pg_roles a WHERE a.rolname = session_user
  UNION
  SELECT g.roleid FROM pg_catalog.pg_auth_members g JOIN m ON g.member = m.oid
  )
  SELECT EXISTS (SELECT 1 FROM m JOIN pg_catalog.pg_roles x ON x.oid = m.oid WHERE x.rolname = r)
$$;

-- The candidates of key in the order a release by session_user would choose
-- them (rank 1 first) under the strategy session_user set on the key, each
-- with whether it is live (registered within its ttl, its backend still
-- connected, its role still existing). rank is NULL for a candidate such a
-- release cannot choose (not live, not ready, no version under a version
-- strategy, or a role other than session_user and the roles it was granted:
-- lease._granted), and for every candidate under any. The backend list is read afresh: pg_stat_activity is otherwise
-- cached for the whole transaction, and a backend gone since would look
-- connected.
CREATE OR REPLACE FUNCTION lease._ranked(key text, now timestamptz)
RETURNS TABLE (owner text, role text, version text, priority integer, ready boolean, live boolean,
             ttl interval, registered_at timestamptz, expires_at timestamptz, rank bigint)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_key      text := key;
  v_strategy text;
  v_roles    text[];
BEGIN
  SELECT s.strategy INTO v_strategy FROM lease.strategies s
   WHERE s.key = v_key AND s.role = session_user::text;
  -- The roles whose candidates the caller's release may choose, each
  -- checked once however many registrations it has.
  v_roles := ARRAY(SELECT d.role FROM (SELECT DISTINCT c.role FROM lease.candidates c WHERE c.key = v_key) d
                  WHERE d.role = session_user::text OR lease._granted(d.role));
  PERFORM pg_catalog.pg_stat_clear_snapshot();
  RETURN QUERY
  WITH c AS (
  SELECT c.*,
         c.expires_at > now
           AND c.pid IN (SELECT a.pid FROM pg_catalog.pg_stat_activity a WHERE a.pid IS NOT NULL)
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = c.role) AS is_live
    FROM lease.candidates c
   WHERE c.key = v_key
  ), e AS (
  SELECT c.*, c.is_live AND c.ready AND v_strategy IS NOT NULL AND c.role = ANY (v_roles)
              AND (v_strategy = 'priority' OR c.version_num IS NOT NULL) AS eligible
    FROM c
  )
  SELECT e.owner, e.role, e.version, e.priority, e.ready, e.is_live, e.ttl, e.registered_at, e.expires_at,
       CASE WHEN e.eligible THEN row_number() OVER (
         ORDER BY e.eligible DESC,
                  CASE WHEN v_strategy = 'priority' THEN -e.priority::bigint END,
                  CASE WHEN v_strategy = 'newest_version' THEN e.version_num END DESC,
                  CASE WHEN v_strategy = 'newest_version' THEN e.version_pre IS NULL END DESC,
                  CASE WHEN v_strategy = 'newest_version' THEN e.version_pre END DESC,
                  CASE WHEN v_strategy = 'oldest_version' THEN e.version_num END,
                  CASE WHEN v_strategy = 'oldest_version' THEN e.version_pre IS NULL END,
                  CASE WHEN v_strategy = 'oldest_version' THEN e.version_pre END,
                  e.registered_at, e.owner, e.role) END
  FROM e
   ORDER BY 10 NULLS LAST, e.registered_at, e.owner, e.role;
END
$$;

-- Called by release, on the key's locked row, after the holder (owner,
-- epoch) was found to be the caller. Grants the key to the candidate that
-- the strategy session_user set on the key chooses among the candidates of
-- session_user and the roles it was granted (lease._ranked; never the
-- releasing owner), epoch + 1, for the candidate's ttl, and returns it; NULL owner when there
-- is none or no new grant may be made now (the grace after a timeline
-- change): the caller then frees the key. Reads candidates and strategies
-- without locking them.
CREATE OR REPLACE FUNCTION lease._handover(key text, owner text, epoch bigint,
                              OUT new_owner text, OUT new_epoch bigint, OUT new_expires timestamptz,
                              OUT new_role text, OUT new_ttl interval)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_key   text := key;
  v_now   timestamptz;
  v_base  bigint;
  v_grace timestamptz;
  c_owner text;
  c_role  text;
  c_ttl   interval;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM lease.strategies s WHERE s.key = v_key AND s.role = session_user::text) THEN
  RETURN;
  END IF;
  v_now := clock_timestamp();
  SELECT r.owner, r.role, r.ttl INTO c_owner, c_role, c_ttl
  FROM lease._ranked(v_key, v_now) r
   WHERE r.rank IS NOT NULL AND r.owner <> _handover.owner
   ORDER BY r.rank LIMIT 1;
  IF NOT FOUND THEN
  RETURN;
  END IF;
  SELECT g.base, g.grace_until INTO v_base, v_grace FROM lease._grant_context() g;
  IF v_grace IS NOT NULL AND clock_timestamp() < v_grace THEN
  RETURN;  -- no new grant during the grace after a timeline change
  END IF;
  v_now := clock_timestamp();
  new_ttl := least(c_ttl, lease._max_ttl());
  UPDATE lease.leases l
   SET owner = c_owner, epoch = greatest(l.epoch, v_base) + 1,
       expires_at = v_now + new_ttl, acquired_at = v_now, holder_role = c_role,
       lapsed_owner = NULL, lapsed_epoch = NULL, life = pg_catalog.pg_postmaster_start_time(),
       life_timeline = lease._timeline()
   WHERE l.key = v_key
  RETURNING l.owner, l.epoch, l.expires_at, l.holder_role INTO new_owner, new_epoch, new_expires, new_role;
END
$$;

-- ---------------------------------------------------------------------------
-- 3. The API: every role (EXECUTE granted to PUBLIC).
-- ---------------------------------------------------------------------------

-- The calls on a handoff's path (acquire, acquire_many, renew, renew_many,
-- release, release_many, force_release, fence, listen) run with generic plans: each of their
-- statements is planned once per connection (on the first call, or by
-- lease.WarmConn in Go), not again on each of the first five calls.

-- Grants key to owner for ttl when it is free, lapsed or never leased, or
-- answers the caller's own current grant again (idempotent). A key held by
-- another owner is denied at once (wait 0) or waited for, polling, up to
-- wait; no lock is held while waiting. Every grant path reads the timeline
-- first: no new grant is made during the grace after a timeline change.
CREATE OR REPLACE FUNCTION lease.acquire(key text, owner text, ttl interval, wait interval DEFAULT '0',
                            OUT acquired boolean, OUT epoch bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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
  v_fast     boolean;
  v_max      interval;
  v_tlok     boolean;
  v_tbase    bigint;
  v_tgrace   timestamptz;
  v_listened boolean;
  v_mode     text;
BEGIN
  -- The common case (wait 0, a ttl of at most 100 years: lease._renew_fast's
  -- bounds) is a simple expression, no statement; max_ttl is then checked
  -- against the setting read with the key's row (below). Otherwise the full
  -- checks, at once.
  v_fast := coalesce(lease._renew_fast(v_key, v_owner, 1, ttl, interval '100 years')
                   AND wait = interval '0' AND isfinite(wait), false);
  IF NOT v_fast OR current_setting('transaction_read_only') = 'on' THEN
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
  v_fast := false;
  END IF;
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
  -- The same statement reads max_ttl and the recorded timeline state: when
  -- the server's timeline and start are the recorded ones, its epoch base
  -- and grace are lease._grant_context()'s answer, without a call.
  SELECT l.key IS NOT NULL, l.owner, l.epoch, l.expires_at, l.holder_role,
         (SELECT s.max_ttl FROM lease.settings s),
         t.timeline = lease._timeline() AND t.started = pg_catalog.pg_postmaster_start_time(),
         (t.era << 40) + (t.restarts::bigint << 24), t.grace_until
    INTO v_found, r_owner, r_epoch, r_expires, r_role, v_max, v_tlok, v_tbase, v_tgrace
    FROM (SELECT 1) one
    LEFT JOIN lease.leases l ON l.key = v_key
    LEFT JOIN LATERAL (
      SELECT x.timeline, x.started, x.era, x.restarts, x.grace_until FROM lease.timeline_state x
       ORDER BY x.era DESC, x.restarts DESC, x.grace_until ASC NULLS FIRST, x.timeline DESC, x.started DESC NULLS LAST
       LIMIT 1) t ON true;
  IF v_fast AND extract(epoch FROM ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
    PERFORM lease._raise_invalid(ARRAY[lease._ttl_violation(ttl, wait)]);
  END IF;
  IF v_base IS NULL AND v_tlok THEN
    v_base := v_tbase; v_grace := v_tgrace;
  END IF;
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
      -- The answer confirms a grant whose commit the caller may never have
      -- seen acknowledged (its wait for the synchronous standbys cancelled):
      -- it must not be acknowledged before the standbys have it. A row lock
      -- is WAL-logged and gives the transaction an xid, so this call's
      -- commit (durability raised as for a change) waits for the standbys
      -- up to its own commit record, which follows the grant's.
      -- Under READ COMMITTED the lock is FOR KEY SHARE: it conflicts only
      -- with FOR UPDATE, which no pg_lease call takes on a held row (clean-up
      -- skips locked rows), so it never waits and makes no one wait; it is
      -- kept until the transaction ends. Under REPEATABLE READ / SERIALIZABLE
      -- the row read is the snapshot's: FOR SHARE (it conflicts with every
      -- change of the row) raises 40001 if it changed since. A row locked
      -- right now by another transaction is not waited for (wait is 0 at
      -- these levels): that is 40001 too. That lock is released at once.
      IF v_rc THEN
        PERFORM FROM lease.leases l WHERE l.key = v_key FOR KEY SHARE;
      ELSE
        BEGIN
          PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE NOWAIT;
          RAISE EXCEPTION USING ERRCODE = 'LEASE';
        EXCEPTION
          WHEN SQLSTATE 'LEASE' THEN
            NULL;
          WHEN lock_not_available THEN
            RAISE EXCEPTION '%', format('could not serialize access: key %L is being changed by another transaction', v_key)
              USING ERRCODE = '40001',
                    HINT = 'Retry the transaction.';
        END;
      END IF;
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
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
      IF v_fast AND v_found THEN
        -- The common case (wait 0, a free or lapsed row), one statement and
        -- no subtransaction: the row is locked only when it is free or
        -- lapsed at a clock read when the lock is taken (now, also the
        -- grant's start), and a row another transaction has locked is
        -- skipped, never waited for. max_ttl was read with the key's row
        -- (no lock wait since). Anything else: the full way below.
        WITH g AS (
          SELECT x.key, x.owner, x.epoch, x.expires_at, clock_timestamp() AS now FROM lease.leases x
           WHERE x.key = v_key AND (x.owner IS NULL OR x.expires_at <= clock_timestamp())
             FOR NO KEY UPDATE SKIP LOCKED)
        UPDATE lease.leases l
           SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,
               expires_at = g.now + v_ttl, acquired_at = g.now, holder_role = v_role,
               lapsed_owner = g.owner, lapsed_epoch = CASE WHEN g.owner IS NOT NULL THEN g.epoch END,
               life = pg_catalog.pg_postmaster_start_time(), life_timeline = lease._timeline()
          FROM g
         WHERE l.key = g.key
        RETURNING g.owner, g.epoch, g.expires_at, g.now, l.epoch, l.expires_at
             INTO r_owner, r_epoch, r_expires, v_now, epoch, expires_at;
        IF FOUND THEN
          IF v_grace IS NOT NULL AND r_epoch <= v_base AND v_grace > r_expires THEN
            PERFORM lease._record(v_key, 'promotion_grace', false, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                  format('no new grant before %s: the grace after %s',
                                         v_grace, lease._grace_cause()), v_now);
          END IF;
            -- The history (lease._record) and whether a session listens for
            -- the key (lease._changed), in one statement begun after the lock.
            WITH p AS (
              SELECT coalesce((SELECT s.keep_rows FROM lease.history_settings s), 100) AS keep,
                     coalesce(h.seq, 0) + 1 AS seq,
                     coalesce(h.grants, 0) + 1 AS grants,
                     h.trimmed_at,
                     coalesce(a.actor_seq, 0) + 1 AS aseq
                FROM (SELECT 1) one
                LEFT JOIN LATERAL (SELECT x.seq, x.grants, x.trimmed_at FROM lease.history x
                                    WHERE x.key = v_key ORDER BY x.seq DESC LIMIT 1) h ON true
                LEFT JOIN LATERAL (SELECT x.actor_seq FROM lease.history x
                                    WHERE x.key = v_key AND x.actor = v_role ORDER BY x.actor_seq DESC LIMIT 1) a ON true
            ), d AS (
              DELETE FROM lease.history h
               WHERE h.key = v_key AND h.actor = v_role
                 AND h.actor_seq > (SELECT p.aseq - p.keep - 8 FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
                 AND h.actor_seq <= (SELECT p.aseq - p.keep FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
              RETURNING h.at
            ), i AS (
              INSERT INTO lease.history (key, seq, at, event, owner, holder_role, epoch, actor, previous_owner,
                                         previous_epoch, vacant_since, ttl, grants, detail, actor_seq, trimmed_at)
              SELECT v_key, p.seq, v_now, CASE WHEN r_owner IS NULL THEN 'acquired' ELSE 'taken_over' END,
                     v_owner, v_role, epoch, v_role, r_owner, CASE WHEN r_owner IS NOT NULL THEN r_epoch END,
                     r_expires, v_ttl, p.grants, NULL, p.aseq, greatest(p.trimmed_at, (SELECT max(d.at) FROM d))
                FROM p
               WHERE p.keep > 0
            )
            SELECT EXISTS (SELECT 1 FROM lease.listeners w WHERE w.key = v_key OR w.key = '*'),
                   (SELECT s.max_ttl FROM lease.settings s)
              INTO v_listened, v_max;
            -- The UPDATE may have waited for lease.configure's table lock
            -- (configure lowering max_ttl when no grant is held): this
            -- statement, begun after it, reads the max_ttl in force.
            IF extract(epoch FROM v_ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
              PERFORM lease._check_ttl_now(v_ttl);
            END IF;
            -- The durability and notification of lease._changed.
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
              PERFORM set_config('synchronous_commit', 'on', true);  -- as lease._changed
            END IF;
            v_mode := coalesce(lower(current_setting('pg_lease.notify', true)), '');
            IF v_mode NOT IN ('off', 'false', 'no', '0', 'f', 'n')
               AND (v_listened OR v_mode IN ('on', 'always', 'true', 'yes', '1', 't', 'y')
                    OR current_setting('transaction_isolation') <> 'read committed') THEN
              PERFORM pg_notify('pg_lease', json_build_object(
                'event', 'acquired', 'key', v_key, 'owner', v_owner, 'epoch', epoch)::text);
            END IF;
            acquired := true;
            RETURN;
          END IF;
        END IF;
        v_lt := current_setting('lock_timeout');
        BEGIN
          -- Every lock wait below is bounded by what is left of the wait.
          -- With wait 0 the row lock is taken NOWAIT and nothing else is
          -- bounded: a lock_timeout would also cut the waits for the
          -- server's own short locks (extending the table or an index, for
          -- one) and deny a free key under load. A first grant's insertion,
          -- which can only wait, waits 100 ms at a time, twice at most.
          IF v_deadline IS NOT NULL OR NOT v_found THEN
            PERFORM set_config('lock_timeout', lease._lock_timeout(v_deadline), true);
          END IF;
          IF NOT v_found THEN
            -- First grant of a never-leased key: the insertion is the lock. (If
            -- it waited for a concurrent first grant that rolled back, the grant
            -- is shorter by that wait, never longer.)
            -- (lease._floor and lease._check_ttl_now, inline: no call.)
            IF NOT v_rc THEN
              PERFORM FROM lease.epoch_floor f FOR SHARE;
            END IF;
            v_first := greatest((SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f), v_base) + 1;
            IF extract(epoch FROM v_ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s),
                                                                        interval '1 hour')) THEN
              PERFORM lease._check_ttl_now(v_ttl);
            END IF;
            v_now := clock_timestamp();
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, acquired_at, holder_role, life, life_timeline)
              VALUES (v_key, v_owner, v_first, v_now + v_ttl, v_now, v_role, pg_catalog.pg_postmaster_start_time(),
                      lease._timeline())
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
              v_first := greatest((SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f), v_base) + 1;
              IF v_first > epoch THEN
                UPDATE lease.leases l SET epoch = v_first WHERE l.key = v_key
                RETURNING l.epoch INTO epoch;
              END IF;
            END IF;
            -- History: lease._record's statement, inline (no call).
            WITH p AS (
              SELECT coalesce((SELECT s.keep_rows FROM lease.history_settings s), 100) AS keep,
                     coalesce(h.seq, 0) + 1 AS seq,
                     coalesce(h.grants, 0) + 1 AS grants,
                     h.trimmed_at,
                     coalesce(a.actor_seq, 0) + 1 AS aseq
                FROM (SELECT 1) one
                LEFT JOIN LATERAL (SELECT x.seq, x.grants, x.trimmed_at FROM lease.history x
                                    WHERE x.key = v_key ORDER BY x.seq DESC LIMIT 1) h ON true
                LEFT JOIN LATERAL (SELECT x.actor_seq FROM lease.history x
                                    WHERE x.key = v_key AND x.actor = v_role ORDER BY x.actor_seq DESC LIMIT 1) a ON true
            ), d AS (
              DELETE FROM lease.history h
               WHERE h.key = v_key AND h.actor = v_role
                 AND h.actor_seq > (SELECT p.aseq - p.keep - 8 FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
                 AND h.actor_seq <= (SELECT p.aseq - p.keep FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
              RETURNING h.at
            )
            INSERT INTO lease.history (key, seq, at, event, owner, holder_role, epoch, actor, previous_owner,
                                       previous_epoch, vacant_since, ttl, grants, detail, actor_seq, trimmed_at)
            SELECT v_key, p.seq, v_now, 'acquired', v_owner, v_role, epoch, v_role, NULL, NULL, NULL, v_ttl,
                   p.grants, NULL, p.aseq, greatest(p.trimmed_at, (SELECT max(d.at) FROM d))
              FROM p
             WHERE p.keep > 0;
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
            IF extract(epoch FROM v_ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s),
                                                                        interval '1 hour')) THEN
              PERFORM lease._check_ttl_now(v_ttl);
            END IF;
            UPDATE lease.leases l
               SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,
                   expires_at = v_now + v_ttl, acquired_at = v_now, holder_role = v_role,
                   lapsed_owner = r_owner, lapsed_epoch = CASE WHEN r_owner IS NOT NULL THEN r_epoch END,
                   life = pg_catalog.pg_postmaster_start_time(), life_timeline = lease._timeline()
             WHERE l.key = v_key
            RETURNING l.epoch, l.expires_at INTO epoch, expires_at;
            -- History: a grace after a timeline change that ended after the
            -- previous grant did (it withheld this grant), then the grant.
            IF v_grace IS NOT NULL AND r_epoch <= v_base AND v_grace > r_expires THEN
              PERFORM lease._record(v_key, 'promotion_grace', false, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                    format('no new grant before %s: the grace after %s',
                                           v_grace, lease._grace_cause()), v_now);
            END IF;
            PERFORM lease._record(v_key, CASE WHEN r_owner IS NULL THEN 'acquired' ELSE 'taken_over' END, true,
                                  v_owner, v_role, epoch, r_owner, CASE WHEN r_owner IS NOT NULL THEN r_epoch END,
                                  r_expires, v_ttl, NULL, v_now);
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
              -- that waited 100 ms (for a concurrent first grant of the key
              -- kept uncommitted, or an overloaded server: read again, once).
              IF NOT v_found AND v_busy < 1 THEN
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
        -- The grant's write may have waited for lease.configure's table lock
        -- (configure lowering max_ttl when no grant is held): read the
        -- max_ttl in force after it, and whether a session listens for the
        -- key, in one statement (the checks of lease._check_ttl_now and
        -- lease._changed, inline).
        SELECT EXISTS (SELECT 1 FROM lease.listeners w WHERE w.key = v_key OR w.key = '*'),
               (SELECT s.max_ttl FROM lease.settings s)
          INTO v_listened, v_max;
        IF extract(epoch FROM v_ttl) > extract(epoch FROM coalesce(v_max, interval '1 hour')) THEN
          PERFORM lease._check_ttl_now(v_ttl);
        END IF;
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
          PERFORM set_config('synchronous_commit', 'on', true);  -- as lease._changed
        END IF;
        v_mode := coalesce(lower(current_setting('pg_lease.notify', true)), '');
        IF v_mode NOT IN ('off', 'false', 'no', '0', 'f', 'n')
           AND (v_listened OR v_mode IN ('on', 'always', 'true', 'yes', '1', 't', 'y')
                OR current_setting('transaction_isolation') <> 'read committed') THEN
          PERFORM pg_notify('pg_lease', json_build_object(
            'event', 'acquired', 'key', v_key, 'owner', v_owner, 'epoch', epoch)::text);
        END IF;
        RETURN;
      END IF;
    END IF;

    -- Denied: the key is held by another owner until r_expires (or no new
    -- grant is made before r_expires, the end of a grace). During a grace the
    -- denial says when it ends: expires_at is set (and epoch NULL), so a
    -- waiting client sleeps until then instead of asking again at once.
    IF v_deadline IS NULL THEN
      acquired := false; epoch := NULL;
      expires_at := CASE WHEN v_in_grace THEN r_expires END;
      RETURN;
    END IF;
    v_now := clock_timestamp();
    IF v_now >= v_deadline THEN
      IF v_in_grace THEN
        RAISE EXCEPTION 'timeout'
          USING ERRCODE = '57014',
                DETAIL = format('no new grant of key %L during the grace after %s, which outlasts the wait of %s; lease.status() shows grace_until',
                                v_key, lease._grace_cause(), wait);
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

-- Extends the caller's current grant to now + ttl (same epoch). status is
-- ok, or not_owner, lapsed or epoch_mismatch (then nothing changes). Locks
-- the key's row only when it is the caller's grant. The common case is one
-- UPDATE: its subquery locks the row only when it names the caller's grant,
-- unexpired at a clock read in the row read (key, owner, epoch, a role the
-- caller may act for), and skips a row another transaction has
-- locked, so it never waits for the row and a refusal locks nothing. The
-- new expiry starts at a reading taken just before the statement (never
-- after the deciding one): the statement may still wait for a table lock
-- on lease.leases (lease.configure's, an operator's DDL), and a renewal
-- that got the row after the grant's expiry is told lapsed; the expiry is
-- then shorter by that wait, never longer. Any other case (refused, the
-- row locked by another transaction, or last granted or renewed in another
-- server life or on another timeline) goes the full way: lease._renew_key
-- in a subtransaction, which waits for the lock and decides at a clock
-- read after it.
CREATE OR REPLACE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key   text := key;
  v_owner text := owner;
  v_epoch bigint := epoch;
  v_ttl   interval;
  v_max   interval;
  v_now   timestamptz;
BEGIN
  -- The common case checks the ttl alone (a simple expression: no
  -- statement runs). The row it renews carries this server life: a grant
  -- or a full-way renewal of this server made it, after the full checks of
  -- its key and owner (and the table holds every epoch to >= 1). max_ttl
  -- is read with the renewal, and a ttl above it undoes it (22023).
  IF isfinite(ttl) AND extract(epoch FROM ttl) > 0 AND extract(epoch FROM ttl) <= 3155760000
     AND clock_timestamp() < timestamptz '294000-01-01 00:00:00+00'
     AND current_setting('transaction_read_only') = 'off' THEN
    v_ttl := lease._seconds(ttl);
    -- v_now (a simple expression) starts the expiry; the row read decides.
    -- The row's life is this postmaster's start and this timeline: there
    -- is no timeline change to record. (The start alone is not enough: a
    -- crash restart keeps the postmaster, and with standby.signal present
    -- it comes back as a standby, which a promotion moves to a new
    -- timeline.)
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
      -- Durability as in lease._changed, but no notification (a renewal wakes nobody).
      IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
      END IF;
      status := 'ok';
      RETURN;
    END IF;
  END IF;

  -- The full way: every check, then lease._renew_key.
  IF lease._renew_fast(v_key, v_owner, v_epoch, ttl, interval '100 years') IS NOT TRUE THEN
    PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    IF extract(epoch FROM ttl) > extract(epoch FROM lease._max_ttl()) THEN
      PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
    END IF;
    PERFORM lease._raise_read_only('lease.renew');
  END IF;
  v_ttl := lease._seconds(ttl);
  IF extract(epoch FROM ttl) > extract(epoch FROM lease._max_ttl()) THEN
    PERFORM lease._raise_invalid(lease._renew_violations(v_key, v_owner, v_epoch, ttl));
  END IF;
  BEGIN
    SELECT r.status, r.expires_at INTO status, expires_at
      FROM lease._renew_key(v_key, v_owner, v_epoch, v_ttl, NULL) r;
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;  -- status says why; the lock went with the subtransaction
  END;
  -- A renewal is the first call on a promoted server in a switchover where
  -- leaders keep renewing: it records the timeline change (the grace
  -- starts), and the row (locked) carries this server life from now on.
  PERFORM lease._grant_context();
  UPDATE lease.leases l SET life = pg_catalog.pg_postmaster_start_time(), life_timeline = lease._timeline()
   WHERE l.key = v_key
     AND (l.life, l.life_timeline) IS DISTINCT FROM (pg_catalog.pg_postmaster_start_time(), lease._timeline());
  IF current_setting('synchronous_commit') IN ('off', 'local') THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
END
$$;

-- Renews many grants of one owner in one statement and one commit. Each key
-- gets what lease.renew(key, owner, epoch, ttl) would answer, with the same
-- precedence, role binding and durability. Only the rows of the caller's own
-- grants (rows naming owner under a role the caller may act for) are locked,
-- in byte order (COLLATE "C", whatever the database's collation: the order of
-- every pg_lease batch and of the Go client's), so two batches never wait on
-- each other in a cycle; every other key is answered from a read that takes
-- no lock. A key whose status is not ok keeps no row lock: the locks of such
-- a round are rolled back and the round runs again without those keys. At
-- most 1000 keys; the rows come back in the order of keys.
CREATE OR REPLACE FUNCTION lease.renew_many(keys text[], owner text, epochs bigint[], ttl interval)
RETURNS TABLE (key text, status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_keys    text[] := keys;
  v_owner   text := owner;
  v_epochs  bigint[] := epochs;
  v_max     constant integer := 1000;
  v_ttl     interval;
  v_now     timestamptz;
  v_exp     timestamptz;
  v_elem    text[];
  v_role    text := session_user;
  v_try_k   text[];    -- the keys of the next round (after its read: the caller's grants, in byte order)
  v_try_e   bigint[];  -- their epochs
  v_other_k text[];    -- one round's keys that are not the caller's grants
  v_other_s text[];    -- and their statuses
  v_ok_k    text[];    -- one round's ok keys, in byte order
  v_ok_e    bigint[];
  v_retry   boolean;   -- a locked key of the round was refused
  v_st      text;
  res_keys  text[] := '{}';  -- decided keys and their statuses
  res_stat  text[] := '{}';
BEGIN
  v_elem := CASE
    WHEN v_keys IS NULL OR v_epochs IS NULL OR array_ndims(v_keys) > 1 OR array_ndims(v_epochs) > 1
      OR cardinality(v_keys) > v_max OR cardinality(v_keys) <> cardinality(v_epochs) THEN '{}'
    ELSE ARRAY(
      SELECT v FROM (
        SELECT 1 AS arg, u.n, lease._text_violation(format('keys[%s]', u.n), u.k) AS v
          FROM unnest(v_keys) WITH ORDINALITY u(k, n)
        UNION ALL
        SELECT 1, d.n, format('keys[%s] repeats keys[%s]', d.n, d.first)
          FROM (SELECT u.n, first_value(u.n) OVER (PARTITION BY u.k ORDER BY u.n) AS first
                  FROM unnest(v_keys) WITH ORDINALITY u(k, n)
                 WHERE lease._text_violation('key', u.k) IS NULL) d
         WHERE d.n <> d.first
        UNION ALL
        SELECT 3, u.n, CASE WHEN u.e IS NULL THEN format('epochs[%s] must not be NULL', u.n)
                            WHEN u.e < 1 THEN format('epochs[%s] must be at least 1', u.n) END
          FROM unnest(v_epochs) WITH ORDINALITY u(e, n)) x
       WHERE x.v IS NOT NULL
       ORDER BY x.arg, x.n)
  END;
  IF cardinality(v_elem) > 10 THEN
    v_elem := v_elem[1:10] || format('and %s more', cardinality(v_elem) - 10);
  END IF;
  PERFORM lease._raise_invalid(ARRAY[
    CASE WHEN v_keys IS NULL THEN 'keys must not be NULL'
         WHEN array_ndims(v_keys) > 1 THEN 'keys must be a one-dimensional array'
         WHEN cardinality(v_keys) > v_max THEN format('keys must hold at most %s keys (%s given)', v_max, cardinality(v_keys)) END,
    lease._text_violation('owner', v_owner),
    CASE WHEN v_epochs IS NULL THEN 'epochs must not be NULL'
         WHEN array_ndims(v_epochs) > 1 THEN 'epochs must be a one-dimensional array'
         WHEN v_keys IS NOT NULL AND cardinality(v_keys) <> cardinality(v_epochs)
           THEN format('keys and epochs must have the same length (%s keys, %s epochs)',
                       cardinality(v_keys), cardinality(v_epochs)) END,
    lease._duration_violation('ttl', ttl, true),
    CASE WHEN ttl IS NOT NULL AND isfinite(ttl)
          AND extract(epoch FROM ttl) > extract(epoch FROM coalesce((SELECT s.max_ttl FROM lease.settings s), interval '1 hour'))
         THEN lease._ttl_violation(ttl, interval '0') END] || v_elem);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.renew_many');
  END IF;
  v_ttl := lease._seconds(ttl);

  v_try_k := v_keys;
  v_try_e := v_epochs;

  -- Each round reads its keys without a lock and answers every key that is
  -- not the caller's grant (lease._renew_key's rule). It then locks the rows
  -- of the caller's grants in byte order and decides each at one clock
  -- reading taken after the locks (lease._renew_key). When one of those is
  -- refused, the round is rolled back with its locks and renewals; the
  -- refusals stay recorded, and the next round tries only the keys that were
  -- ok.
  WHILE cardinality(v_try_k) > 0 LOOP
    BEGIN
      SELECT coalesce(array_agg(u.k ORDER BY u.k COLLATE "C") FILTER (WHERE m.mine), '{}'),
             coalesce(array_agg(u.e ORDER BY u.k COLLATE "C") FILTER (WHERE m.mine), '{}'),
             coalesce(array_agg(u.k) FILTER (WHERE NOT m.mine), '{}'),
             coalesce(array_agg(CASE WHEN s.st = 'ok' THEN 'not_owner' ELSE s.st END) FILTER (WHERE NOT m.mine), '{}')
        INTO v_try_k, v_try_e, v_other_k, v_other_s
        FROM unnest(v_try_k, v_try_e) u(k, e)
        LEFT JOIN lease.leases l ON l.key = u.k
        CROSS JOIN LATERAL (SELECT coalesce(l.owner = v_owner
                                            AND (l.holder_role IS NULL OR l.holder_role = v_role
                                                 OR lease._may_act(l.holder_role)), false) AS mine) m
        CROSS JOIN LATERAL (SELECT lease._holder_status(l.key IS NOT NULL, l.owner, l.epoch, l.expires_at,
                                                        l.lapsed_owner, l.lapsed_epoch, v_owner, u.e,
                                                        clock_timestamp()) AS st) s;
      res_keys := res_keys || v_other_k;
      res_stat := res_stat || v_other_s;
      PERFORM FROM lease.leases l WHERE l.key = ANY (v_try_k) ORDER BY l.key COLLATE "C" FOR NO KEY UPDATE;
      v_now := clock_timestamp();
      v_ok_k := '{}';
      v_ok_e := '{}';
      v_retry := false;
      FOR i IN 1 .. cardinality(v_try_k) LOOP
        SELECT r.status INTO v_st
          FROM lease._renew_key(v_try_k[i], v_owner, v_try_e[i], v_ttl, v_now) r;
        IF v_st = 'ok' THEN
          v_ok_k := v_ok_k || v_try_k[i];
          v_ok_e := v_ok_e || v_try_e[i];
        ELSE
          res_keys := res_keys || v_try_k[i];
          res_stat := res_stat || v_st;
          v_retry := true;  -- its row was locked by this round
        END IF;
      END LOOP;
      v_try_k := v_ok_k;
      v_try_e := v_ok_e;
      IF v_retry THEN
        RAISE EXCEPTION USING ERRCODE = 'LEASE';
      END IF;
      res_keys := res_keys || v_ok_k;
      res_stat := res_stat || array_fill('ok'::text, ARRAY[cardinality(v_ok_k)]);
      IF cardinality(v_ok_k) > 0 THEN
        v_exp := v_now + v_ttl;
      END IF;
      v_try_k := '{}';
    EXCEPTION WHEN SQLSTATE 'LEASE' THEN
      NULL;  -- the refusals are recorded; the locks went with the subtransaction
    END;
  END LOOP;

  -- Durability and the timeline change, as renew, when a key was renewed.
  IF v_exp IS NOT NULL THEN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
      PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM lease._grant_context();
  END IF;
  RETURN QUERY
    SELECT i.k, r.st, CASE WHEN r.st = 'ok' THEN v_exp END
      FROM unnest(v_keys) WITH ORDINALITY i(k, n)
      JOIN unnest(res_keys, res_stat) r(k, st) ON r.k = i.k
     ORDER BY i.n;
END
$$;

-- Frees the caller's current grant; the key's counter becomes epoch + 1.
-- With a strategy set on the key by the releasing role and a ready candidate
-- of a role it may act as, the key goes to that candidate instead, epoch + 1,
-- in this transaction (lease._handover); only that grant
-- is announced ('handover', naming the new holder and epoch). status as for
-- renew.
CREATE OR REPLACE FUNCTION lease.release(key text, owner text, epoch bigint, OUT status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key     text := key;
  v_owner   text := owner;
  v_epoch   bigint := epoch;
  v_now     timestamptz;
  v_found   boolean;
  v_locked  boolean;
  v_next    text;
  v_nepoch  bigint;
  v_nrole   text;
  v_nttl    interval;
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_lowner  text;
  r_lepoch  bigint;
  r_role    text;
  v_listened boolean;
  v_mode    text;
  v_actor   text := session_user;
BEGIN
  -- The common case of valid arguments: a simple expression, no statement.
  IF NOT coalesce(v_key <> '' AND v_owner <> ''
                  AND octet_length(v_key) <= 1024 AND octet_length(v_owner) <= 1024
                  AND v_key !~ '[\x01-\x1f\x7f]' AND v_owner !~ '[\x01-\x1f\x7f]'
                  AND v_epoch >= 1, false) THEN
    PERFORM lease._raise_invalid(ARRAY[
      lease._text_violation('key', v_key),
      lease._text_violation('owner', v_owner),
      lease._epoch_violation(v_epoch)]);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.release');
  END IF;

  -- The common case, one statement: the caller's unexpired grant (key,
  -- owner, epoch, a role it may act for) and no strategy of the caller's on
  -- the key, unexpired at a clock read in the row read, is freed at a
  -- reading taken just before the statement (the release's time: the row's
  -- expires_at, the history's), never after the deciding one: the
  -- statement may wait for a table lock on lease.leases, and a release
  -- that got the row after the grant's expiry is told lapsed. A row
  -- another transaction has locked is skipped, never waited for, and a
  -- refusal locks nothing. Anything else goes the full way below.
  v_now := clock_timestamp();
  WITH g AS (
    SELECT x.key, x.holder_role FROM lease.leases x
     WHERE x.key = v_key AND x.owner = v_owner AND x.epoch = v_epoch
       AND x.expires_at > clock_timestamp()
       AND (x.holder_role IS NULL OR x.holder_role = session_user::text OR lease._may_act(x.holder_role))
       AND NOT EXISTS (SELECT 1 FROM lease.strategies s WHERE s.key = v_key AND s.role = session_user::text)
       FOR NO KEY UPDATE SKIP LOCKED)
  UPDATE lease.leases l SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now, holder_role = NULL
    FROM g
   WHERE l.key = g.key
  RETURNING g.holder_role, l.expires_at INTO r_role, v_now;
  IF FOUND THEN
    status := 'ok';
    -- The history (lease._record) and whether a session listens for the key
    -- (lease._changed), in one statement begun after the lock.
    WITH p AS (
      SELECT coalesce((SELECT s.keep_rows FROM lease.history_settings s), 100) AS keep,
             coalesce(h.seq, 0) + 1 AS seq,
             coalesce(h.grants, 0) AS grants,
             h.trimmed_at,
             coalesce(a.actor_seq, 0) + 1 AS aseq
        FROM (SELECT 1) one
        LEFT JOIN LATERAL (SELECT x.seq, x.grants, x.trimmed_at FROM lease.history x
                            WHERE x.key = v_key ORDER BY x.seq DESC LIMIT 1) h ON true
        LEFT JOIN LATERAL (SELECT x.actor_seq FROM lease.history x
                            WHERE x.key = v_key AND x.actor = v_actor ORDER BY x.actor_seq DESC LIMIT 1) a ON true
    ), d AS (
      DELETE FROM lease.history h
       WHERE h.key = v_key AND h.actor = v_actor
         AND h.actor_seq > (SELECT p.aseq - p.keep - 8 FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
         AND h.actor_seq <= (SELECT p.aseq - p.keep FROM p WHERE p.keep > 0 AND p.aseq > p.keep)
      RETURNING h.at
    ), i AS (
      INSERT INTO lease.history (key, seq, at, event, owner, holder_role, epoch, actor, previous_owner,
                                 previous_epoch, vacant_since, ttl, grants, detail, actor_seq, trimmed_at)
      SELECT v_key, p.seq, v_now, 'released', v_owner, r_role, v_epoch, v_actor, NULL, NULL, NULL, NULL,
             p.grants, NULL, p.aseq, greatest(p.trimmed_at, (SELECT max(d.at) FROM d))
        FROM p
       WHERE p.keep > 0
    )
    SELECT EXISTS (SELECT 1 FROM lease.listeners w WHERE w.key = v_key OR w.key = '*') INTO v_listened;
    -- The durability and notification of lease._changed.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
      PERFORM set_config('synchronous_commit', 'on', true);  -- as lease._changed
    END IF;
    v_mode := coalesce(lower(current_setting('pg_lease.notify', true)), '');
    IF v_mode NOT IN ('off', 'false', 'no', '0', 'f', 'n')
       AND (v_listened OR v_mode IN ('on', 'always', 'true', 'yes', '1', 't', 'y')
            OR current_setting('transaction_isolation') <> 'read committed') THEN
      PERFORM pg_notify('pg_lease', json_build_object(
        'event', 'released', 'key', v_key, 'owner', v_owner, 'epoch', v_epoch)::text);
    END IF;
    RETURN;
  END IF;

  BEGIN
    -- The row is locked only when it is the caller's grant (as in
    -- lease._renew_key): a refused release makes no one else wait.
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
      FROM lease.leases l
     WHERE l.key = v_key AND l.owner = v_owner
       AND (l.holder_role IS NULL OR l.holder_role = session_user::text OR lease._may_act(l.holder_role))
       FOR NO KEY UPDATE;
    v_locked := FOUND;
    v_found := v_locked;
    IF NOT v_locked THEN
      SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
        INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
        FROM lease.leases l WHERE l.key = v_key;
      v_found := FOUND;
      IF v_found AND r_owner = v_owner AND (r_role IS NULL OR r_role = session_user::text OR lease._may_act(r_role)) THEN
        -- Granted to the caller since the first read: lock it, read it again.
        SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
          INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
          FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
        v_found := FOUND;
        v_locked := FOUND;
      END IF;
    END IF;
    v_now := clock_timestamp();
    status := lease._holder_status(v_found, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, v_now);
    IF status = 'ok' AND (NOT v_locked
                          OR r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role)) THEN
      status := 'not_owner';
    END IF;
    IF status <> 'ok' THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    END IF;
    SELECT h.new_owner, h.new_epoch, h.new_role, h.new_ttl INTO v_next, v_nepoch, v_nrole, v_nttl
      FROM lease._handover(v_key, v_owner, r_epoch) h;
    IF v_next IS NULL THEN
      UPDATE lease.leases l SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now, holder_role = NULL
       WHERE l.key = v_key;
    END IF;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;
  END;
  IF v_next IS NULL THEN
    PERFORM lease._record(v_key, 'released', false, v_owner, r_role, v_epoch, NULL, NULL, NULL, NULL, NULL, v_now);
    PERFORM lease._changed('released', v_key, v_owner, v_epoch);
  ELSE
    -- History: one term begun by a handover, with no gap before it.
    PERFORM lease._record(v_key, 'handed_over', true, v_next, v_nrole, v_nepoch, v_owner, v_epoch, NULL,
                          v_nttl, NULL, clock_timestamp());
    PERFORM lease._changed('handover', v_key, v_next, v_nepoch);
  END IF;
  RETURN;
END
$$;

-- The violations of a batch's keys (and of its epochs, when epochs is given):
-- each element's, then repeats, at most ten and a count of the rest; the
-- array-level rules are the caller's.
CREATE OR REPLACE FUNCTION lease._batch_violations(keys text[], epochs bigint[])
RETURNS text[] LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE WHEN cardinality(v) > 10 THEN v[1:10] || format('and %s more', cardinality(v) - 10) ELSE v END
    FROM (SELECT ARRAY(
      SELECT x.v FROM (
        SELECT 1 AS arg, u.n, lease._text_violation(format('keys[%s]', u.n), u.k) AS v
          FROM unnest(keys) WITH ORDINALITY u(k, n)
        UNION ALL
        SELECT 1, d.n, format('keys[%s] repeats keys[%s]', d.n, d.first)
          FROM (SELECT u.n, first_value(u.n) OVER (PARTITION BY u.k ORDER BY u.n) AS first
                  FROM unnest(keys) WITH ORDINALITY u(k, n)
                 WHERE lease._text_violation('key', u.k) IS NULL) d
         WHERE d.n <> d.first
        UNION ALL
        SELECT 3, u.n, CASE WHEN u.e IS NULL THEN format('epochs[%s] must not be NULL', u.n)
                            WHEN u.e < 1 THEN format('epochs[%s] must be at least 1', u.n) END
          FROM unnest(epochs) WITH ORDINALITY u(e, n)) x
       WHERE x.v IS NOT NULL
       ORDER BY x.arg, x.n) AS v) y
$$;

-- The array-level violation of a batch's keys: NULL, 2-D, over 1000 keys.
CREATE OR REPLACE FUNCTION lease._keys_violation(keys text[])
RETURNS text LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE WHEN keys IS NULL THEN 'keys must not be NULL'
              WHEN array_ndims(keys) > 1 THEN 'keys must be a one-dimensional array'
              WHEN cardinality(keys) > 1000 THEN format('keys must hold at most 1000 keys (%s given)', cardinality(keys)) END
$$;

-- lease.acquire(key, owner, ttl, wait 0) for each of keys, in byte order of
-- the keys (so that concurrent batches lock rows in one order), in one
-- statement and one transaction; rows in input order, each as acquire
-- answers it. Nothing waits for a holder.
CREATE OR REPLACE FUNCTION lease.acquire_many(keys text[], owner text, ttl interval)
RETURNS TABLE (key text, acquired boolean, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_keys  text[] := keys;
  v_owner text := owner;
  v_ttl   interval := ttl;
  v_k     text;
  v_a     boolean;
  v_e     bigint;
  v_x     timestamptz;
  res_k   text[] := '{}';
  res_a   boolean[] := '{}';
  res_e   bigint[] := '{}';
  res_x   timestamptz[] := '{}';
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._keys_violation(v_keys),
    lease._text_violation('owner', v_owner),
    lease._duration_violation('ttl', v_ttl, true)]
    || CASE WHEN lease._keys_violation(v_keys) IS NULL THEN lease._batch_violations(v_keys, NULL) ELSE '{}' END);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.acquire_many');
  END IF;
  FOR v_k IN SELECT u.k FROM unnest(v_keys) u(k) ORDER BY u.k COLLATE "C" LOOP
    SELECT a.acquired, a.epoch, a.expires_at INTO v_a, v_e, v_x
      FROM lease.acquire(v_k, v_owner, v_ttl, interval '0') a;
    res_k := res_k || v_k;
    res_a := res_a || v_a;
    res_e := res_e || v_e;
    res_x := res_x || v_x;
  END LOOP;
  RETURN QUERY
    SELECT i.k, r.a, r.e, r.x
      FROM unnest(v_keys) WITH ORDINALITY i(k, n)
      JOIN unnest(res_k, res_a, res_e, res_x) r(k, a, e, x) ON r.k = i.k
     ORDER BY i.n;
END
$$;

-- lease.release(key, owner, epoch) for each key and its epoch, in byte
-- order of the keys, in one statement and one transaction; rows in input
-- order, each with the status release answers. Each release hands its key
-- over as release does (a strategy of the releasing role and a ready
-- candidate), so a replica that leaves hands every shard to its successor
-- at once.
CREATE OR REPLACE FUNCTION lease.release_many(keys text[], owner text, epochs bigint[])
RETURNS TABLE (key text, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_keys   text[] := keys;
  v_owner  text := owner;
  v_epochs bigint[] := epochs;
  v_k      text;
  v_e      bigint;
  v_st     text;
  res_k    text[] := '{}';
  res_s    text[] := '{}';
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._keys_violation(v_keys),
    lease._text_violation('owner', v_owner),
    CASE WHEN v_epochs IS NULL THEN 'epochs must not be NULL'
         WHEN array_ndims(v_epochs) > 1 THEN 'epochs must be a one-dimensional array'
         WHEN v_keys IS NOT NULL AND cardinality(v_keys) <> cardinality(v_epochs)
           THEN format('keys and epochs must have the same length (%s keys, %s epochs)',
                       cardinality(v_keys), cardinality(v_epochs)) END]
    || CASE WHEN lease._keys_violation(v_keys) IS NULL AND v_epochs IS NOT NULL AND array_ndims(v_epochs) <= 1
              AND cardinality(v_keys) = cardinality(v_epochs)
            THEN lease._batch_violations(v_keys, v_epochs) ELSE '{}' END);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.release_many');
  END IF;
  FOR v_k, v_e IN SELECT u.k, u.e FROM unnest(v_keys, v_epochs) u(k, e) ORDER BY u.k COLLATE "C" LOOP
    v_st := lease.release(v_k, v_owner, v_e);
    res_k := res_k || v_k;
    res_s := res_s || v_st;
  END LOOP;
  RETURN QUERY
    SELECT i.k, r.s
      FROM unnest(v_keys) WITH ORDINALITY i(k, n)
      JOIN unnest(res_k, res_s) r(k, s) ON r.k = i.k
     ORDER BY i.n;
END
$$;

-- The key's state with lazy expiry, as lease.list reports it (its own query:
-- followers call it often). No row for a key never leased. Takes no lock.
CREATE OR REPLACE FUNCTION lease.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz,
               state text, last_owner text, since timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_key text := key;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  RETURN QUERY
    SELECT h, CASE WHEN h THEN l.owner END, l.epoch, CASE WHEN h THEN l.expires_at END,
           CASE WHEN h THEN 'held' WHEN l.owner IS NOT NULL THEN 'lapsed' ELSE 'released' END,
           l.owner, CASE WHEN h THEN l.acquired_at ELSE l.expires_at END
      FROM lease.leases l,
           LATERAL (SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h) s
     WHERE l.key = v_key;
END
$$;

-- The keys (every key when keys is NULL) that have a row, in ascending key
-- order, with lazy expiry. held, owner, acquired_at and expires_at describe
-- the current grant and are NULL unless held. state says what a key is:
-- 'held'; 'lapsed' (the last grant expired without a release); 'released'
-- (by its holder or by force_release). last_owner is the owner of the
-- current or lapsed grant (NULL once released): every role saw it in owner
-- while the grant was held. since is when the state began on the server's
-- clock: the grant, the expiry, or the release. Takes no lock.
CREATE OR REPLACE FUNCTION lease.list(keys text[] DEFAULT NULL)
RETURNS TABLE (key text, held boolean, owner text, epoch bigint,
               acquired_at timestamptz, expires_at timestamptz,
               state text, last_owner text, since timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_keys text[] := keys;
  v_elem text[];
BEGIN
  IF array_ndims(v_keys) > 1 THEN
    PERFORM lease._raise_invalid(ARRAY['keys must be a one-dimensional array']);
  END IF;
  v_elem := ARRAY(SELECT v FROM (
                    SELECT lease._text_violation(format('keys[%s]', u.n), u.k) AS v, u.n
                      FROM unnest(v_keys) WITH ORDINALITY u(k, n)) x
                   WHERE x.v IS NOT NULL ORDER BY x.n);
  IF cardinality(v_elem) > 10 THEN
    v_elem := v_elem[1:10] || format('and %s more', cardinality(v_elem) - 10);
  END IF;
  PERFORM lease._raise_invalid(v_elem);
  -- Two branches in one statement: the plan cached for this function (for
  -- every key, or for named keys) then serves both kinds of call.
  RETURN QUERY
    SELECT l.key, s.h, CASE WHEN s.h THEN l.owner END, l.epoch,
           CASE WHEN s.h THEN l.acquired_at END, CASE WHEN s.h THEN l.expires_at END,
           CASE WHEN s.h THEN 'held' WHEN l.owner IS NOT NULL THEN 'lapsed' ELSE 'released' END,
           l.owner, CASE WHEN s.h THEN l.acquired_at ELSE l.expires_at END
      FROM (SELECT * FROM lease.leases a WHERE v_keys IS NULL
            UNION ALL
            SELECT * FROM lease.leases b WHERE b.key = ANY (v_keys)) l,
           LATERAL (SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h) s
     ORDER BY l.key;
END
$$;

-- Fenced write in the same database. Called inside the caller's own
-- transaction, it asserts that (key, owner, epoch) is the current, unexpired
-- grant of the caller's role. It keeps a FOR SHARE lock on the row until that
-- transaction ends, so no takeover or release commits before the caller's
-- writes do. Otherwise it raises 55000 with message not_owner, lapsed or
-- epoch_mismatch. Another role presenting the holder's owner string and epoch
-- is told not_owner, so it cannot hold a fence open and delay the holder's
-- renewals. (A failed fence keeps no lock: its error aborts the caller's
-- transaction.) Returns the grant's expiry.
CREATE OR REPLACE FUNCTION lease.fence(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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
  -- Read first without a lock: a call that is not the holder's (another
  -- role's, a free key's) is refused without touching the row, so a loop
  -- of them never makes another role's wait-0 acquire see a locked row.
  SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
    INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
    FROM lease.leases l WHERE l.key = v_key;
  v_status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                   v_owner, v_epoch, clock_timestamp());
  IF v_status = 'ok' AND r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role) THEN
    v_status := 'not_owner';
  END IF;
  IF v_status = 'ok' THEN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner, l.lapsed_epoch, l.holder_role
      INTO r_owner, r_epoch, r_expires, r_lowner, r_lepoch, r_role
      FROM lease.leases l WHERE l.key = v_key FOR SHARE;
    v_status := lease._holder_status(FOUND, r_owner, r_epoch, r_expires, r_lowner, r_lepoch,
                                     v_owner, v_epoch, clock_timestamp());
    IF v_status = 'ok' AND r_role IS NOT NULL AND r_role <> session_user::text AND NOT lease._may_act(r_role) THEN
      v_status := 'not_owner';
    END IF;
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

-- Registers this backend as waiting for notifications of key ('*': of every
-- key), for pg_lease.notify = 'waiters' (specs/SEMANTICS.md). A waiter runs
-- LISTEN pg_lease, then listen(key) in a transaction of its own until it
-- returns true, then reads the key's state. It misses no change: a change
-- whose notify decision came before the registration was committed still
-- held the key's row lock (or its uncommitted first grant) then. listen
-- waits for such a change to end, without keeping any lock, so a read that
-- follows sees it. Every later change sees the registration and notifies.
-- true: the registration was committed before this call, so the guarantee
-- holds. false: a new registration; call again after this transaction ends.
-- '*' registers every key and waits for nothing. A session that registered
-- '*' adds no row for a key: listen(key) then only waits for the key's change
-- in flight, and answers true once '*' was committed before the call. A
-- session may hold at most 1000 registrations of keys (54000 beyond), and
-- '*' beside them.
-- Each call also drops a few registrations of backends that are gone.
CREATE OR REPLACE FUNCTION lease.listen(key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key   text := key;
  v_pid   integer := pg_backend_pid();
  v_max   constant integer := 1000;
  v_since timestamptz;
  v_n     bigint;
  v_live  integer[];
  v_gone  integer[];
  v_pid_gone integer;
  v_left  bigint;
BEGIN
  IF v_key IS DISTINCT FROM '*' THEN
    PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.listen');
  END IF;

  -- Clean-up of backends that are gone, bounded: the distinct pids through
  -- the pid index, then at most 100 rows of the 8 lowest gone backends. The
  -- list of live backends is read fresh: a transaction's cached copy may
  -- predate a backend that registered. Rows another session has locked (its
  -- own clean-up deleting them, in a transaction still open) are skipped,
  -- never waited for: the next gone backends' rows are taken instead.
  PERFORM pg_stat_clear_snapshot();
  v_live := ARRAY(SELECT a.pid FROM pg_stat_get_activity(NULL::integer) a WHERE a.pid IS NOT NULL);
  v_gone := ARRAY(
    WITH RECURSIVE p(pid) AS (
      (SELECT w.pid FROM lease.listeners w ORDER BY w.pid LIMIT 1)
      UNION ALL
      SELECT (SELECT w.pid FROM lease.listeners w WHERE w.pid > p.pid ORDER BY w.pid LIMIT 1)
        FROM p WHERE p.pid IS NOT NULL
    )
    SELECT p.pid FROM p WHERE p.pid IS NOT NULL AND p.pid <> ALL (v_live) ORDER BY p.pid LIMIT 8);
  v_left := 100;
  FOREACH v_pid_gone IN ARRAY v_gone LOOP
    -- (Through the pid index, from the end of the backend's entries: the
    -- first entry of each pid, where the search above lands, stays live.)
    DELETE FROM lease.listeners w
     WHERE w.ctid = ANY (ARRAY(SELECT g.ctid FROM lease.listeners g WHERE g.pid = v_pid_gone
                                ORDER BY g.pid DESC LIMIT v_left FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_left := v_left - v_n;
    EXIT WHEN v_left <= 0;
  END LOOP;

  SELECT w.since INTO v_since FROM lease.listeners w WHERE w.key = v_key AND w.pid = v_pid;
  IF NOT FOUND AND v_key <> '*' THEN
    SELECT w.since INTO v_since FROM lease.listeners w WHERE w.key = '*' AND w.pid = v_pid;
  END IF;
  IF NOT FOUND THEN
    -- (EXECUTE: planned for this pid, through the pid index, never as one
    -- generic plan that may scan every backend's registrations.)
    EXECUTE 'SELECT count(*) FROM lease.listeners w WHERE w.pid = $1 AND w.key <> ''*''' INTO v_n USING v_pid;
    IF v_n >= v_max AND v_key <> '*' THEN
      RAISE EXCEPTION 'too_many_registrations'
        USING ERRCODE = '54000',
              DETAIL = format('this session has %s registrations, the most one session may hold', v_n),
              HINT = 'Drop keys with lease.unlisten, or register ''*'' for every key.';
    END IF;
    INSERT INTO lease.listeners AS w (pid, key, since)
      VALUES (v_pid, v_key, clock_timestamp())
      ON CONFLICT ON CONSTRAINT listeners_pkey DO NOTHING;
  END IF;

  IF v_key <> '*' THEN
    -- Wait for a change of the key in flight, keeping no lock. A row lock
    -- taken in a subtransaction is released when it rolls back. A key with
    -- no committed row may have a first grant in flight: an insertion of
    -- the key waits for it, and is rolled back with the subtransaction.
    BEGIN
      PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE;
      IF NOT FOUND THEN
        INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, acquired_at)
          VALUES (v_key, NULL, 1, clock_timestamp(), clock_timestamp())
          ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
        IF NOT FOUND THEN
          PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE;
        END IF;
      END IF;
      RAISE EXCEPTION USING ERRCODE = 'LEASE';
    EXCEPTION WHEN SQLSTATE 'LEASE' THEN
      NULL;
    END;
  END IF;
  RETURN v_since IS NOT NULL AND v_since < transaction_timestamp();
END
$$;

-- Drops this backend's registration for key ('*': all of this backend's
-- registrations). Returns how many were dropped. A row another session has
-- locked (its clean-up deleting the registrations of a gone backend whose
-- pid this one reuses) is skipped, never waited for.
CREATE OR REPLACE FUNCTION lease.unlisten(key text)
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
   WHERE w.ctid = ANY (ARRAY(SELECT g.ctid FROM lease.listeners g
                              WHERE g.pid = pg_backend_pid() AND (v_key = '*' OR g.key = v_key)
                                FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END
$$;

-- Every role: the settings and the recorded timeline state (what a grant path
-- or a renewal last saw; it does not read the server's timeline, so it also
-- answers on a standby). promotion_grace is the grace a promotion seen now
-- would impose; grace_until is when the grace of the last one recorded ends.
DROP FUNCTION IF EXISTS lease.status();
CREATE FUNCTION lease.status(OUT max_ttl interval, OUT promotion_grace interval,
                             OUT timeline bigint, OUT era bigint, OUT grace_until timestamptz,
                             OUT epoch_floor bigint, OUT promotion text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT lease._max_ttl(), lease._grace(), t.timeline, t.era, t.grace_until,
         (SELECT coalesce(max(f.floor), 0) FROM lease.epoch_floor f),
         coalesce((SELECT s.promotion FROM lease.settings s), 'any')
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (SELECT * FROM lease.timeline_state s
                        ORDER BY s.era DESC, s.restarts DESC, s.grace_until ASC NULLS FIRST, s.timeline DESC,
                                 s.started DESC NULLS LAST
                        LIMIT 1) t ON true
$$;

-- Every role that may inspect: the last max_rows events of key, oldest
-- first. owner, holder_role and epoch are the grant the event concerns (the
-- new one, or the one that ended); actor is the role whose call made it.
-- holder_role and actor are shown only to that role and its members (NULL
-- to others), as inspect shows no role.
CREATE OR REPLACE FUNCTION lease.history(key text, max_rows integer DEFAULT 100)
RETURNS TABLE (seq bigint, at timestamptz, event text, owner text, holder_role text, epoch bigint,
               actor text, previous_owner text, previous_epoch bigint, vacant_since timestamptz,
               ttl interval, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_key  text := key;
  v_rows integer := max_rows;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    CASE WHEN v_rows IS NULL THEN 'max_rows must not be NULL'
         WHEN v_rows < 1 OR v_rows > 10000 THEN 'max_rows must be between 1 and 10000' END]);
  RETURN QUERY
    SELECT x.seq, x.at, x.event, x.owner, lease._shown_role(x.holder_role), x.epoch,
           lease._shown_role(x.actor), x.previous_owner, x.previous_epoch, x.vacant_since, x.ttl, x.detail
      FROM (SELECT h.* FROM lease.history h WHERE h.key = v_key ORDER BY h.seq DESC LIMIT v_rows) x
     ORDER BY x.seq;
END
$$;

-- Every role that may inspect: every key's leadership over the last period,
-- as lease.list reports it (lazy expiry), plus: when the key was last held
-- (vacant_since, when not held), the ttl of its current or last grant,
-- grants (a counter of the terms recorded since its history began), the
-- terms begun within the period (transitions), the seconds within the
-- period with no holder (leaderless_seconds: the gaps before each grant in
-- the period, and the current one), and since when the key's history is
-- complete (history_since: its oldest event kept, or the newest event that
-- retention removed when that is later; transitions and leaderless_seconds
-- see no further back). A key's first grant has no gap before it.
-- holder_role is shown only to that role and its members (NULL to others).
-- Reads only: no lock.
CREATE OR REPLACE FUNCTION lease.health(period interval DEFAULT '1 hour')
RETURNS TABLE (key text, held boolean, owner text, holder_role text, epoch bigint,
               term_started timestamptz, expires_at timestamptz, vacant_since timestamptz,
               ttl interval, grants bigint, transitions bigint, leaderless_seconds double precision,
               history_since timestamptz, observed_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_now  timestamptz := clock_timestamp();
  v_from timestamptz;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._duration_violation('period', period, true),
    CASE WHEN period IS NOT NULL AND isfinite(period)
          AND extract(epoch FROM period) > extract(epoch FROM interval '100 years')
         THEN 'period must be at most 100 years' END]);
  v_from := v_now - lease._seconds(period);
  RETURN QUERY
    SELECT l.key, s.h, CASE WHEN s.h THEN l.owner END, CASE WHEN s.h THEN lease._shown_role(l.holder_role) END,
           l.epoch,
           CASE WHEN s.h THEN l.acquired_at END, CASE WHEN s.h THEN l.expires_at END,
           CASE WHEN NOT s.h THEN l.expires_at END,
           g.ttl, last.grants, coalesce(w.n, 0),
           coalesce(w.gaps, 0)
             + CASE WHEN s.h THEN 0
                    ELSE greatest(0, extract(epoch FROM v_now - greatest(l.expires_at, v_from))::float8) END,
           greatest(first.at, last.trimmed_at), v_now
      FROM lease.leases l
     CROSS JOIN LATERAL (SELECT l.owner IS NOT NULL AND l.expires_at > v_now AS h) s
      LEFT JOIN LATERAL (SELECT h.grants, h.trimmed_at FROM lease.history h
                          WHERE h.key = l.key ORDER BY h.seq DESC LIMIT 1) last ON true
      LEFT JOIN LATERAL (SELECT h.at FROM lease.history h
                          WHERE h.key = l.key ORDER BY h.seq LIMIT 1) first ON true
      LEFT JOIN LATERAL (SELECT h.ttl FROM lease.history h
                          WHERE h.key = l.key AND h.ttl IS NOT NULL ORDER BY h.seq DESC LIMIT 1) g ON true
      LEFT JOIN LATERAL (SELECT count(*) AS n,
                                sum(greatest(0, extract(epoch FROM h.at - greatest(h.vacant_since, v_from))::float8))
                                  FILTER (WHERE h.vacant_since IS NOT NULL) AS gaps
                           FROM lease.history h
                          WHERE h.key = l.key AND h.at > v_from
                            AND h.event IN ('acquired', 'taken_over', 'handed_over')) w ON true
     ORDER BY l.key;
END
$$;

-- The installed SQL version.
CREATE OR REPLACE FUNCTION lease.version()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.5.0'::text $$;


-- lease.candidate: registers (or refreshes) owner as a candidate of key. The
-- registration lasts ttl unless refreshed and ends with this backend's
-- connection; a handover grants the key for ttl. version (NULL: none, which
-- the version strategies never choose), priority (higher first) and ready
-- (only ready candidates are chosen) replace the registered ones. The
-- registration is the caller's role's own: another role's registration of
-- the same owner string is another row, which neither refuses nor replaces
-- it. status: ok. At most lease._max_candidates() registrations per role
-- (54000 beyond, nothing added).
CREATE OR REPLACE FUNCTION lease.candidate(key text, owner text, ttl interval,
                                version text DEFAULT NULL, priority integer DEFAULT 0,
                                ready boolean DEFAULT true,
                                OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key   text := key;
  v_owner text := owner;
  v_role  text := session_user;
  v_ttl   interval;
  v_now   timestamptz;
  v_num   numeric[];
  v_pre   text;
  v_n     bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner),
    lease._duration_violation('ttl', ttl, true),
    CASE WHEN ttl IS NOT NULL AND isfinite(ttl) THEN lease._ttl_violation(ttl, interval '0') END,
    lease._version_violation(version),
    CASE WHEN priority IS NULL THEN 'priority must not be NULL' END,
    CASE WHEN ready IS NULL THEN 'ready must not be NULL' END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.candidate');
  END IF;
  v_ttl := lease._seconds(ttl);
  SELECT p.num, p.pre INTO v_num, v_pre FROM lease._version_parts(version) p;
  v_now := clock_timestamp();

  -- Refresh of this role's registration (the common case): one row.
  UPDATE lease.candidates c
     SET pid = pg_backend_pid(), version = candidate.version, version_num = v_num, version_pre = v_pre,
         priority = candidate.priority, ready = candidate.ready, ttl = v_ttl,
         registered_at = CASE WHEN c.expires_at > v_now THEN c.registered_at ELSE v_now END,
         expires_at = v_now + v_ttl
   WHERE c.key = v_key AND c.owner = v_owner AND c.role = v_role
  RETURNING c.expires_at INTO expires_at;
  IF FOUND THEN
    status := 'ok';
    RETURN;
  END IF;

  -- A new registration: take the role's registrar row first, then drop
  -- this role's registrations of the key that are gone (never another
  -- role's rows, whose locks we would keep). In this order a transaction
  -- waiting for the registrar row holds no gone row that the one holding
  -- it must drop: the other order deadlocked two of them. A gone row
  -- locked by another transaction (its refresh) is skipped, not waited
  -- for: that transaction may wait for the registrar row next. A row
  -- refreshed since it was read is live again, and stays.
  PERFORM lease._lock_registrar();
  DELETE FROM lease.candidates c
   WHERE c.ctid IN (
     SELECT x.ctid FROM lease.candidates x
      WHERE x.key = v_key AND x.role = v_role
        AND x.owner IN (SELECT r.owner FROM lease._ranked(v_key, v_now) r WHERE r.role = v_role AND NOT r.live)
        AND NOT (x.expires_at > v_now
                 AND x.pid IN (SELECT a.pid FROM pg_catalog.pg_stat_activity a WHERE a.pid IS NOT NULL))
        FOR UPDATE SKIP LOCKED);
  SELECT count(*) INTO v_n FROM lease.candidates c WHERE c.role = v_role;
  IF v_n >= lease._max_candidates() THEN
    RAISE EXCEPTION 'too_many_candidates'
      USING ERRCODE = '54000',
            DETAIL = format('role %s already has %s candidate registrations, the most a role may have',
                            v_role, v_n),
            HINT = 'Withdraw registrations that are no longer needed (lease.withdraw).';
  END IF;
  INSERT INTO lease.candidates AS c (key, owner, role, pid, version, version_num, version_pre,
                                     priority, ready, ttl, registered_at, expires_at)
    VALUES (v_key, v_owner, v_role, pg_backend_pid(), version, v_num, v_pre,
            priority, ready, v_ttl, v_now, v_now + v_ttl)
    ON CONFLICT ON CONSTRAINT candidates_pkey DO UPDATE
      SET pid = excluded.pid, version = excluded.version,
          version_num = excluded.version_num, version_pre = excluded.version_pre,
          priority = excluded.priority, ready = excluded.ready, ttl = excluded.ttl,
          registered_at = excluded.registered_at, expires_at = excluded.expires_at
  RETURNING c.expires_at INTO expires_at;
  status := 'ok';
END
$$;

-- lease.withdraw: ends the registrations of owner for key made by the
-- caller's role or by roles it is a member of (never another role's);
-- returns whether a registration was removed.
CREATE OR REPLACE FUNCTION lease.withdraw(key text, owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key   text := key;
  v_owner text := owner;
  v_roles text[];
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._text_violation('owner', v_owner)]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.withdraw');
  END IF;
  -- Unlocked read first: another role's row is never locked.
  v_roles := ARRAY(SELECT c.role FROM lease.candidates c
                    WHERE c.key = v_key AND c.owner = v_owner
                      AND (c.role = session_user::text OR lease._may_act(c.role)));
  IF cardinality(v_roles) = 0 THEN
    RETURN false;
  END IF;
  DELETE FROM lease.candidates c WHERE c.key = v_key AND c.owner = v_owner AND c.role = ANY (v_roles);
  RETURN FOUND;
END
$$;

-- lease.set_strategy: who a release of key by the caller's role
-- (session_user) hands it to: any (no handover: the key is freed and the
-- waiters race), priority, newest_version or oldest_version. Each role has
-- its own strategy per key, which governs only its own releases: no role
-- reads, changes or is refused by another's. Returns the caller's role's
-- strategy before the call. At most lease._max_candidates() keys with a
-- strategy per role (54000 beyond, nothing added). Locks only the caller's
-- role's rows: its registrar row first, then its row of the key (none when
-- there is nothing to change), the order of every registration, so that two
-- transactions of the role never wait for each other's rows in turn.
CREATE OR REPLACE FUNCTION lease.set_strategy(key text, strategy text, OUT previous text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key      text := key;
  v_strategy text := strategy;
  v_role     text := session_user;
  v_n        bigint;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    lease._text_violation('key', v_key),
    lease._strategy_violation(v_strategy)]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.set_strategy');
  END IF;
  -- The registrar row before the key's row, whether the key has a
  -- strategy already or gets a new one: with the key's row first, a
  -- transaction waiting for the registrar row held a row that the one
  -- holding it asked for next, a deadlock. Only 'any' on a key without a
  -- strategy changes nothing and takes nothing.
  IF v_strategy <> 'any'
     OR EXISTS (SELECT 1 FROM lease.strategies s WHERE s.key = v_key AND s.role = v_role) THEN
    PERFORM lease._lock_registrar();
  END IF;
  SELECT s.strategy INTO previous FROM lease.strategies s
   WHERE s.key = v_key AND s.role = v_role FOR UPDATE;
  IF FOUND THEN
    IF v_strategy = 'any' THEN
      DELETE FROM lease.strategies s WHERE s.key = v_key AND s.role = v_role;
    ELSE
      UPDATE lease.strategies s SET strategy = v_strategy, set_at = clock_timestamp()
       WHERE s.key = v_key AND s.role = v_role;
    END IF;
    RETURN;
  END IF;
  previous := 'any';
  IF v_strategy = 'any' THEN
    RETURN;
  END IF;
  SELECT count(*) INTO v_n FROM lease.strategies s WHERE s.role = v_role;
  IF v_n >= lease._max_candidates() THEN
    RAISE EXCEPTION 'too_many_strategies'
      USING ERRCODE = '54000',
            DETAIL = format('role %s already set a strategy on %s keys, the most a role may set', v_role, v_n),
            HINT = 'Set strategy any on keys that no longer need one.';
  END IF;
  INSERT INTO lease.strategies AS s (key, strategy, role, set_at)
    VALUES (v_key, v_strategy, v_role, clock_timestamp())
    ON CONFLICT ON CONSTRAINT strategies_pkey DO UPDATE
      SET strategy = excluded.strategy, set_at = excluded.set_at;
END
$$;

-- lease.strategy(key): the strategy the caller's role set on key (any when
-- none).
CREATE OR REPLACE FUNCTION lease.strategy(key text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text := key;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  RETURN coalesce((SELECT s.strategy FROM lease.strategies s
                    WHERE s.key = v_key AND s.role = session_user::text), 'any');
END
$$;

-- lease.candidates(key): the strategy the caller's role set on key, and the
-- key's candidates in the order a release by the caller would choose them
-- (rank 1 first; NULL: not choosable by it now, including every candidate
-- of a role other than its own and those it was granted). The role is not shown, as in inspect. Never
-- writes, never locks.
CREATE OR REPLACE FUNCTION lease.candidates(key text)
RETURNS TABLE (strategy text, owner text, version text, priority integer, ready boolean,
               live boolean, rank bigint, registered_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key      text := key;
  v_strategy text;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  v_strategy := coalesce((SELECT s.strategy FROM lease.strategies s
                           WHERE s.key = v_key AND s.role = session_user::text), 'any');
  RETURN QUERY
  SELECT v_strategy, r.owner, r.version, r.priority, r.ready, r.live, r.rank, r.registered_at, r.expires_at
    FROM lease._ranked(v_key, clock_timestamp()) r;
END
$$;

-- ---------------------------------------------------------------------------
-- 4. Operator functions (EXECUTE revoked from PUBLIC).
-- ---------------------------------------------------------------------------

-- Frees a key whatever its holder and increments its epoch, so the former
-- holder is fenced. Returns whether a grant (held or lapsed) was ended, its
-- owner, and the key's epoch counter afterwards.
CREATE OR REPLACE FUNCTION lease.force_release(key text,
                                    OUT released boolean, OUT previous_owner text, OUT epoch bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_key     text := key;
  r_owner   text;
  r_epoch   bigint;
  r_expires timestamptz;
  r_role    text;
  v_now     timestamptz;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[lease._text_violation('key', v_key)]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.force_release');
  END IF;
  released := false;
  BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.holder_role INTO r_owner, r_epoch, r_expires, r_role
      FROM lease.leases l WHERE l.key = v_key FOR NO KEY UPDATE;
    epoch := r_epoch;
    IF r_owner IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- never leased, or already free
    END IF;
    v_now := clock_timestamp();
    UPDATE lease.leases l
       SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now, holder_role = NULL
     WHERE l.key = v_key
    RETURNING l.epoch INTO epoch;
    released := true;
    previous_owner := r_owner;
  EXCEPTION WHEN SQLSTATE 'LEASE' THEN
    RETURN;
  END;
  PERFORM lease._record(v_key, 'force_released', false, r_owner, r_role, r_epoch, NULL, NULL, NULL, NULL,
                        CASE WHEN r_expires <= v_now THEN 'the grant had lapsed' END, v_now);
  PERFORM lease._changed('force_released', v_key, r_owner, r_epoch);
  RETURN;
END
$$;

-- Deletes at most max_rows keys that have been free (released, or lapsed and
-- not taken over) for at least free_for, oldest first, skipping rows another
-- transaction has locked. It first raises the epoch floor to the highest
-- epoch it deletes, in the same transaction: a snapshot that no longer sees a
-- deleted row sees the raised floor. An acquire that still saw the row locks
-- it, finds it gone, and starts over. Returns how many rows it removed and
-- the floor afterwards.
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
    RETURNING l.key, l.epoch
  ), gone_history AS (
    -- a removed key's history goes with it (0.4.0)
    DELETE FROM lease.history h USING gone g WHERE h.key = g.key
  )
  SELECT count(*), max(g.epoch) INTO removed, v_max FROM gone g;

  -- The deletions and the floor commit together, so a crash that loses an
  -- asynchronous commit loses both. No durability forcing is needed.
  IF v_max > epoch_floor THEN
    UPDATE lease.epoch_floor f SET floor = v_max;
    epoch_floor := v_max;
  END IF;
END
$$;

-- Sets the maximum ttl that acquire and renew accept and the promotion mode
-- (NULL: leave it), and returns the settings and the promotion grace they
-- imply now. promotion 'synchronous' states that only a standby holding every
-- commit the primary acknowledged can be promoted (specs/FAILURE-MODEL.md):
-- no grace; 'any' (the default): a grace of max_ttl.
-- A change that lowers the grace keeps the previous grace in force for its
-- own length (prev_max_ttl until prev_until): grants made under it may still
-- be believed, also ones in flight now. Only when no grant is held and no
-- other transaction is changing lease.leases (a SHARE lock taken NOWAIT,
-- kept until this transaction ends) is nothing believed: then the lower
-- grace applies at once (a fresh database, a quiet one). A new server life
-- (promotion, restart) is recorded first, with the grace before the change.
DROP FUNCTION IF EXISTS lease.configure(interval);
CREATE FUNCTION lease.configure(max_ttl interval DEFAULT NULL, promotion text DEFAULT NULL,
                                OUT configured_max_ttl interval, OUT promotion_grace interval,
                                OUT configured_promotion text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_max   interval := configure.max_ttl;
  v_mode  text := configure.promotion;
  v_old   interval;
  v_new   interval;
  v_quiet boolean := false;
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    CASE WHEN v_max IS NULL THEN NULL
         WHEN NOT isfinite(v_max) THEN 'max_ttl must be finite'
         WHEN extract(epoch FROM v_max) <= 0 THEN 'max_ttl must be positive'
         WHEN extract(epoch FROM v_max) > extract(epoch FROM interval '100 years')
           THEN 'max_ttl must be at most 100 years' END,
    CASE WHEN v_mode IS NOT NULL AND v_mode NOT IN ('any', 'synchronous')
           THEN 'promotion must be ''any'' or ''synchronous''' END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.configure');
  END IF;
  IF v_max IS NOT NULL OR v_mode IS NOT NULL THEN
    -- A server life not recorded yet (after a promotion or a restart) is
    -- recorded first, with its grace from the settings before this change: a
    -- grant the old life made and this one lost may still be believed, and
    -- lease.leases cannot show it (so "no grant held" below proves nothing
    -- about it).
    PERFORM lease._grant_context();
    v_old := lease._grace();
    INSERT INTO lease.settings AS s (max_ttl, promotion)
      VALUES (coalesce(lease._seconds(v_max), interval '1 hour'), v_mode)
      ON CONFLICT (singleton) DO UPDATE
        SET max_ttl = CASE WHEN v_max IS NULL THEN s.max_ttl ELSE excluded.max_ttl END,
            promotion = coalesce(excluded.promotion, s.promotion);
    SELECT CASE WHEN s.promotion = 'synchronous' THEN interval '0' ELSE s.max_ttl END
      INTO v_new FROM lease.settings s;
    IF v_old > v_new
       AND NOT EXISTS (SELECT 1 FROM lease.leases l WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) THEN
      BEGIN
        LOCK TABLE lease.leases IN SHARE MODE NOWAIT;
        v_quiet := NOT EXISTS (SELECT 1 FROM lease.leases l
                                WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp());
      EXCEPTION WHEN lock_not_available THEN
        v_quiet := false;
      END;
    END IF;
    UPDATE lease.settings s
       SET prev_max_ttl = CASE WHEN v_old > v_new AND NOT v_quiet THEN v_old END,
           prev_until = CASE WHEN v_old > v_new AND NOT v_quiet THEN clock_timestamp() + v_old END;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
      PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
  END IF;
  configured_max_ttl := lease._max_ttl();
  promotion_grace := lease._grace();
  configured_promotion := coalesce((SELECT s.promotion FROM lease.settings s), 'any');
END
$$;

-- Operators only (EXECUTE revoked from PUBLIC): how many events each key
-- keeps of each role that made events of it (0 to 100000; 0 records nothing;
-- NULL: leave it). Lowering it trims every key's history at once, which locks
-- the rows it deletes (and each trimmed key's newest row, which records the
-- trim): run it in a transaction of its own.
CREATE OR REPLACE FUNCTION lease.configure_history(keep_rows integer DEFAULT NULL, OUT history_rows integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_keep integer := configure_history.keep_rows;
  v_keys text[];
  v_cuts timestamptz[];
BEGIN
  PERFORM lease._raise_invalid(ARRAY[
    CASE WHEN v_keep < 0 OR v_keep > 100000 THEN 'keep_rows must be between 0 and 100000' END]);
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM lease._raise_read_only('lease.configure_history');
  END IF;
  IF v_keep IS NOT NULL THEN
    INSERT INTO lease.history_settings AS s (keep_rows) VALUES (v_keep)
      ON CONFLICT (singleton) DO UPDATE SET keep_rows = excluded.keep_rows;
    IF v_keep = 0 THEN
      DELETE FROM lease.history;
    ELSE
      -- Each key's newest row (never trimmed: it is its actor's newest)
      -- records the newest event trimmed.
      WITH d AS (
        DELETE FROM lease.history h
         USING (SELECT x.key, x.actor, max(x.actor_seq) AS last FROM lease.history x
                 GROUP BY x.key, x.actor) m
         WHERE h.key = m.key AND h.actor = m.actor AND h.actor_seq <= m.last - v_keep
        RETURNING h.key, h.at)
      SELECT array_agg(c.key), array_agg(c.cut) INTO v_keys, v_cuts
        FROM (SELECT d.key, max(d.at) AS cut FROM d GROUP BY d.key) c;
      UPDATE lease.history h SET trimmed_at = greatest(h.trimmed_at, c.cut)
        FROM unnest(v_keys, v_cuts) c(key, cut)
       WHERE h.key = c.key AND h.seq = (SELECT max(x.seq) FROM lease.history x WHERE x.key = c.key);
    END IF;
  END IF;
  history_rows := coalesce((SELECT s.keep_rows FROM lease.history_settings s), 100);
END
$$;

-- ---------------------------------------------------------------------------
-- 5. Dump and privileges
-- ---------------------------------------------------------------------------

-- The state tables are configuration tables, so pg_dump keeps their rows.
-- Only inside CREATE or ALTER EXTENSION: a schema-only install is dumped like
-- any schema. (Registering a table again only replaces its condition.)
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
              WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) 'lease'::pg_catalog.regnamespace
                AND e.extname OPERATOR(pg_catalog.=) 'pg_lease'
                AND d.deptype OPERATOR(pg_catalog.=) 'e') THEN
    PERFORM pg_catalog.pg_extension_config_dump('lease.leases', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.epoch_floor', 'WHERE floor > 0');
    PERFORM pg_catalog.pg_extension_config_dump('lease.timeline_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.settings', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.strategies', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.history', '');
    PERFORM pg_catalog.pg_extension_config_dump('lease.history_settings', '');
  END IF;
END
$$;

-- Ownership and privileges, reset on every install and update. Everything in
-- schema lease belongs to the schema's owner (the installer), whoever runs the
-- script. Every ACL is emptied of every grantee but the owner, PUBLIC included,
-- whatever default privileges or earlier GRANTs put there. Then the intended
-- privileges are granted again: USAGE on the schema and EXECUTE on the API to
-- PUBLIC; the tables, the helpers and the operator functions to the owner only.
DO $$
DECLARE
  v_owner pg_catalog.oid;
  v_name  pg_catalog.text;
  r       record;
  g       record;
BEGIN
  SELECT n.nspowner INTO STRICT v_owner
    FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'lease';
  v_name := pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(v_owner));

  FOR r IN
    SELECT 'TABLE' AS kind, c.oid::pg_catalog.regclass::pg_catalog.text AS obj,
           c.relowner AS owner, c.relacl AS acl
      FROM pg_catalog.pg_class c
     WHERE c.relnamespace OPERATOR(pg_catalog.=) 'lease'::pg_catalog.regnamespace
       AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog."char"[])
    UNION ALL
    SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proowner, p.proacl
      FROM pg_catalog.pg_proc p
     WHERE p.pronamespace OPERATOR(pg_catalog.=) 'lease'::pg_catalog.regnamespace
    UNION ALL
    SELECT 'SCHEMA', 'lease', n.nspowner, n.nspacl
      FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'
  LOOP
    IF r.owner OPERATOR(pg_catalog.<>) v_owner THEN
      EXECUTE pg_catalog.format('ALTER %s %s OWNER TO %s', r.kind, r.obj, v_name);
    END IF;
    EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC', r.kind, r.obj);
    FOR g IN
      SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(r.acl) a
       WHERE a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
         AND a.grantee OPERATOR(pg_catalog.<>) v_owner
         AND a.grantee OPERATOR(pg_catalog.<>) r.owner
    LOOP
      EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s CASCADE', r.kind, r.obj,
                                pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)));
    END LOOP;
    -- The owner keeps (or gets back) every privilege on its own objects.
    EXECUTE pg_catalog.format('GRANT ALL ON %s %s TO %s', r.kind, r.obj, v_name);
  END LOOP;
END
$$;

GRANT USAGE ON SCHEMA lease TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_many(text[], text, bigint[], interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire_many(text[], text, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release_many(text[], text, bigint[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.list(text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.status() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.listen(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.unlisten(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.version() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.candidate(text, text, interval, text, integer, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.withdraw(text, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.set_strategy(text, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.strategy(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.candidates(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.history(text, integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.health(interval) TO PUBLIC;

-- @shared-end

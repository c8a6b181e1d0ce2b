-- pg_lease 0.1.0 -> 0.2.0: clean-up of keys that have been free for a long
-- time, without ever letting an epoch regress.
--
-- Lease rows used to persist forever. lease.cleanup(free_for) deletes the rows
-- of keys that have been free (released, or lapsed and not taken over) for at
-- least free_for, and first raises a per-database epoch floor to the highest
-- epoch counter it deletes. A key's first grant then carries floor + 1
-- instead of 1, so a key that comes back after clean-up still gets an epoch
-- above every epoch it ever had (I2, I3): guards that remember an old epoch
-- keep rejecting it.
--
-- Race with a first grant: the floor rises in the same transaction that
-- deletes the rows, so a snapshot that no longer sees a deleted row sees the
-- raised floor; an acquire that still saw the row locks it, finds it gone
-- once the clean-up commits, and starts over (lease.acquire's loop).

\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.2.0'" to load this file. \quit

-- Added after the release, the only change to this script: search_path
-- pinned first, so that no statement below resolves a name in a schema
-- another role can create in. The extension command restores it afterwards.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

CREATE TABLE lease.epoch_floor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    floor     bigint  NOT NULL DEFAULT 0 CHECK (floor >= 0)
);
COMMENT ON TABLE lease.epoch_floor IS
  'pg_lease internal: every key''s first grant carries an epoch above floor';
INSERT INTO lease.epoch_floor DEFAULT VALUES;

CREATE OR REPLACE FUNCTION lease._first_epoch()
RETURNS bigint LANGUAGE sql STABLE
AS $$ SELECT f.floor + 1 FROM lease.epoch_floor f $$;

-- Deletes at most max_rows keys that have been free for at least free_for
-- (server time), oldest first, skipping rows another transaction has locked.
-- Returns how many it removed and the epoch floor afterwards. Operators only:
-- EXECUTE is revoked from PUBLIC.
CREATE FUNCTION lease.cleanup(free_for interval, max_rows integer DEFAULT 10000,
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
    CASE WHEN v_limit IS NULL THEN 'max_rows must not be NULL'
         WHEN v_limit < 1 THEN 'max_rows must be at least 1' END]);

  -- The floor row lock serializes clean-ups; first grants only read it.
  SELECT f.floor INTO epoch_floor FROM lease.epoch_floor f FOR UPDATE;
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

  -- The deletions and the floor commit together, so even a crash that loses
  -- an asynchronous commit loses both (and a later first grant's forced
  -- flush covers this commit's WAL too): no durability forcing is needed.
  IF v_max > epoch_floor THEN
    UPDATE lease.epoch_floor f SET floor = v_max RETURNING f.floor INTO epoch_floor;
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION lease.version()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.2.0'::text $$;

-- The new objects belong to whoever owns the rest of pg_lease (the owner of
-- schema lease), not to the role running this update: a superuser updating a
-- non-superuser's install must not end up owning lease.cleanup, a SECURITY
-- DEFINER function that calls helpers the installer owns and could replace.
DO $$
DECLARE
  v_owner text;
BEGIN
  SELECT n.nspowner::regrole::text INTO STRICT v_owner
    FROM pg_catalog.pg_namespace n WHERE n.nspname = 'lease';
  EXECUTE format('ALTER TABLE lease.epoch_floor OWNER TO %s', v_owner);
  EXECUTE format('ALTER FUNCTION lease.cleanup(interval, integer) OWNER TO %s', v_owner);
END
$$;
REVOKE ALL ON TABLE lease.epoch_floor FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.cleanup(interval, integer) FROM PUBLIC;

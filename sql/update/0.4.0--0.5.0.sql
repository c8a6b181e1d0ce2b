-- State 0.4.0 -> 0.5.0.

-- The shared part creates lease.configure(interval, text) anew (it drops
-- only 0.3.0's configure(interval) itself): drop 0.4.0's first.
DROP FUNCTION IF EXISTS lease.configure(interval, text);
-- lease._renew_key answers more columns from 0.5.0 (CREATE OR REPLACE cannot
-- change a function's row type): drop 0.4.0's.
DROP FUNCTION IF EXISTS lease._renew_key(text, text, bigint, interval, timestamptz);

-- ---------------------------------------------------------------------------
-- Handover: registrations and strategies belong to the role that made them.
-- The same owner string registered by two roles is two registrations, and a
-- strategy is kept per key and role (a role's strategy governs only its own
-- releases). The rows of 0.4.0 stay, each under the role that made it.
-- ---------------------------------------------------------------------------

ALTER TABLE lease.candidates DROP CONSTRAINT candidates_pkey;
ALTER TABLE lease.candidates ADD CONSTRAINT candidates_pkey PRIMARY KEY (key, owner, role);
ALTER TABLE lease.strategies DROP CONSTRAINT strategies_pkey;
ALTER TABLE lease.strategies ADD CONSTRAINT strategies_pkey PRIMARY KEY (key, role);
COMMENT ON TABLE lease.strategies IS
  'pg_lease internal: who a release by role hands a key to (lease.set_strategy); no row means any';

-- The bound of a role's registrations and strategies holds across its
-- concurrent transactions: each new one locks its role's row first.
CREATE UNLOGGED TABLE lease.registrars (
    role text        NOT NULL,
    at   timestamptz NOT NULL,
    CONSTRAINT registrars_pkey PRIMARY KEY (role)
);
COMMENT ON TABLE lease.registrars IS
  'pg_lease internal: a row per role, locked by its new candidate registrations and strategies (their bound)';

-- ---------------------------------------------------------------------------
-- History: retention per key and role (the actor that made each event), so
-- one role's events never push another's out. actor_seq numbers each actor's
-- events of a key from its oldest kept; trimmed_at, the newest event removed
-- before (none is known for the events kept by 0.4.0).
-- ---------------------------------------------------------------------------

ALTER TABLE lease.history ADD COLUMN actor_seq bigint;
ALTER TABLE lease.history ADD COLUMN trimmed_at timestamptz;
UPDATE lease.history h
   SET actor_seq = n.rn
  FROM (SELECT x.key, x.seq,
               pg_catalog.row_number() OVER (PARTITION BY x.key, x.actor ORDER BY x.seq) AS rn
          FROM lease.history x) n
 WHERE h.key OPERATOR(pg_catalog.=) n.key AND h.seq OPERATOR(pg_catalog.=) n.seq;
ALTER TABLE lease.history ALTER COLUMN actor_seq SET NOT NULL;
COMMENT ON TABLE lease.history IS
  'pg_lease internal: the last events of each key and role (lease.history, lease.health; retention: lease.configure_history)';
COMMENT ON COLUMN lease.history.actor_seq IS
  'pg_lease internal: numbers the events of this key made by this actor (the retention trims by it)';
COMMENT ON COLUMN lease.history.trimmed_at IS
  'pg_lease internal: the time of the newest event of this key that retention removed before this one (NULL: none)';
CREATE INDEX history_actor ON lease.history (key, actor, actor_seq);
COMMENT ON TABLE lease.history_settings IS
  'pg_lease internal: history retention (lease.configure_history); no row means 100 events per key and role';

-- The postmaster start and the restarts of the era beside the timeline and
-- era: another postmaster on the same timeline (a restart) moves to the next
-- restart of the era, epochs above era * 2^40 + restarts * 2^24
-- (lease._grant_context). The rows of 0.4.0 keep started NULL, "not known":
-- the first call after the update records the start, with the same base and
-- no grace.
ALTER TABLE lease.timeline_state ADD COLUMN started timestamptz;
ALTER TABLE lease.timeline_state ADD COLUMN restarts integer NOT NULL DEFAULT 0
  CHECK (restarts OPERATOR(pg_catalog.>=) 0 AND restarts OPERATOR(pg_catalog.<) 65536);
COMMENT ON TABLE lease.timeline_state IS
  'pg_lease internal: the WAL timeline and postmaster start last seen, its epoch era and restarts, no new grant before grace_until';

-- The server life whose timeline record a grant or renewal of the row found
-- current: renew's common case reads it instead of the record. The rows of
-- 0.4.0 keep NULL: their next renewal checks the record.
ALTER TABLE lease.leases ADD COLUMN life timestamptz;
COMMENT ON COLUMN lease.leases.life IS
  'pg_lease internal: postmaster start of the server life whose timeline record the last grant or renewal of this row found current';
-- With the timeline of that grant or renewal: one postmaster may write on
-- two (a crash restart into recovery, then a promotion).
ALTER TABLE lease.leases ADD COLUMN life_timeline bigint;
COMMENT ON COLUMN lease.leases.life_timeline IS
  'pg_lease internal: the WAL timeline of that grant or renewal (one postmaster may write on two: a crash restart into recovery, then a promotion)';

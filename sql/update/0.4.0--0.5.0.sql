-- State 0.4.0 -> 0.5.0.

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

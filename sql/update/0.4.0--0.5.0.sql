-- State 0.4.0 -> 0.5.0.

-- The postmaster start beside the timeline and era: another postmaster on
-- the same timeline (a restart) moves to a higher era (lease._grant_context).
-- The rows of 0.4.0 keep NULL, "not known": the first call after the update
-- records the start in the same era, with no grace.
ALTER TABLE lease.timeline_state ADD COLUMN started timestamptz;
COMMENT ON TABLE lease.timeline_state IS
  'pg_lease internal: the WAL timeline and postmaster start last seen, its epoch era, no new grant before grace_until';

-- State 0.1.0 -> 0.2.0: the epoch floor that lease.cleanup raises (the table
-- as 0.2.0 made it; the next step drops its primary key).
CREATE TABLE lease.epoch_floor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    floor     bigint  NOT NULL DEFAULT 0 CHECK (floor OPERATOR(pg_catalog.>=) 0)
);
COMMENT ON TABLE lease.epoch_floor IS
  'pg_lease internal: every key''s first grant carries an epoch above floor';
INSERT INTO lease.epoch_floor DEFAULT VALUES;

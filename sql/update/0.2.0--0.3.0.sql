-- State 0.2.0 -> 0.3.0: grants bound to a role, a floor without a primary key,
-- the timeline state, the listeners' registrations and the operator settings.
-- Every 0.2.0 row and epoch is kept as it is; old grants have holder_role NULL.
ALTER TABLE lease.leases ADD COLUMN holder_role text;
COMMENT ON COLUMN lease.leases.holder_role IS
  'pg_lease internal: session_user of the grant (NULL: granted before 0.3.0, or free)';

ALTER TABLE lease.epoch_floor DROP CONSTRAINT epoch_floor_pkey;

CREATE TABLE lease.timeline_state (
    timeline    bigint      NOT NULL,
    era         bigint      NOT NULL CHECK (era OPERATOR(pg_catalog.>=) 0 AND era OPERATOR(pg_catalog.<) 8388607),
    grace_until timestamptz
);
COMMENT ON TABLE lease.timeline_state IS
  'pg_lease internal: the WAL timeline last seen, its epoch era, no new grant before grace_until';
INSERT INTO lease.timeline_state (timeline, era)
  VALUES ((('x'::pg_catalog.text OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)
           )::pg_catalog.bit(32))::pg_catalog.int8, 0);

CREATE UNLOGGED TABLE lease.listeners (
    pid   integer     NOT NULL,
    key   text        NOT NULL,
    since timestamptz NOT NULL,
    CONSTRAINT listeners_pkey PRIMARY KEY (key, pid)
);
COMMENT ON TABLE lease.listeners IS
  'pg_lease internal: backends waiting for notifications of a key (''*'': every key)';

CREATE TABLE lease.settings (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_ttl      interval NOT NULL,
    prev_max_ttl interval,
    prev_until   timestamptz
);
COMMENT ON TABLE lease.settings IS
  'pg_lease internal: operator settings (lease.configure); no row means the defaults';
-- Grants made before 0.3.0 may outlast the default max_ttl (1 hour). The
-- promotion grace covers them until the longest one ends, as if an operator
-- had just lowered max_ttl from their length.
INSERT INTO lease.settings (max_ttl, prev_max_ttl, prev_until)
SELECT '1 hour'::pg_catalog.interval,
       lease._seconds(pg_catalog.max(l.expires_at) OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()),
       pg_catalog.max(l.expires_at)
  FROM lease.leases l
 WHERE l.owner IS NOT NULL
   AND l.expires_at OPERATOR(pg_catalog.>)
       (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) '1 hour'::pg_catalog.interval)
HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0;

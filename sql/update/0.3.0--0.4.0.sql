-- State 0.3.0 -> 0.4.0.

-- ---------------------------------------------------------------------------
-- Leadership history (0.4.0): every grant, takeover, release, forced release
-- and promotion grace of a key, recorded by the functions that make them, in
-- the same transaction, under the key's row lock. Each key keeps its last
-- history_rows events (lease.configure_history, default 100): a write trims
-- the key's oldest rows, so storage is bounded per key, and clean-up removes
-- a key's history with the key. Read through lease.history and lease.health.
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
    CONSTRAINT history_pkey PRIMARY KEY (key, seq),
    CONSTRAINT history_key_fkey FOREIGN KEY (key) REFERENCES lease.leases (key) ON DELETE CASCADE,
    CONSTRAINT history_event_check CHECK (event IN ('acquired', 'taken_over', 'handed_over', 'released',
                                                    'force_released', 'promotion_grace'))
);
COMMENT ON TABLE lease.history IS
  'pg_lease internal: the last events of each key (lease.history, lease.health; retention: lease.configure_history)';

-- No row: the default retention, 100 events per key.
CREATE TABLE lease.history_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_rows integer NOT NULL CHECK (keep_rows BETWEEN 0 AND 100000)
);
COMMENT ON TABLE lease.history_settings IS
  'pg_lease internal: history retention (lease.configure_history); no row means 100 events per key';

-- State 0.3.0 -> 0.4.0.

-- ---------------------------------------------------------------------------
-- Leadership history (0.4.0): every grant, takeover, release, forced release
-- and promotion grace of a key, recorded by the functions that make them, in
-- the same transaction, under the key's row lock. Each key keeps its last
-- history_rows events (lease.configure_history, default 100): a write trims
-- the key's oldest row, so storage is bounded per key, and clean-up removes
-- a key's history with the key (no foreign key: its check would cost every
-- write). Read through lease.history and lease.health.
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
    CONSTRAINT history_event_check CHECK (event OPERATOR(pg_catalog.=) ANY (ARRAY['acquired', 'taken_over', 'handed_over', 'released',
                                                    'force_released', 'promotion_grace']::pg_catalog.text[]))
);
COMMENT ON TABLE lease.history IS
  'pg_lease internal: the last events of each key (lease.history, lease.health; retention: lease.configure_history)';

-- No row: the default retention, 100 events per key.
CREATE TABLE lease.history_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_rows integer NOT NULL CHECK (keep_rows OPERATOR(pg_catalog.>=) 0 AND keep_rows OPERATOR(pg_catalog.<=) 100000)
);
COMMENT ON TABLE lease.history_settings IS
  'pg_lease internal: history retention (lease.configure_history); no row means 100 events per key';

-- ---------------------------------------------------------------------------
-- Handover (0.4.0): the candidates and strategies of keys (new, empty).
-- ---------------------------------------------------------------------------

-- Registrations. UNLOGGED: they belong to live backends, which a crash or a
-- failover ends anyway; never dumped.
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
    CONSTRAINT candidates_pkey PRIMARY KEY (key, owner)
);
CREATE INDEX candidates_role ON lease.candidates (role);
COMMENT ON TABLE lease.candidates IS
  'pg_lease internal: candidates of a key for a handover on release (lease.candidate)';

-- Strategies. No row: any (the waiters race, as before).
CREATE TABLE lease.strategies (
    key      text        NOT NULL,
    strategy text        NOT NULL CHECK (strategy OPERATOR(pg_catalog.=) ANY (ARRAY['priority', 'newest_version', 'oldest_version']::pg_catalog.text[])),
    role     text        NOT NULL,
    set_at   timestamptz NOT NULL,
    CONSTRAINT strategies_pkey PRIMARY KEY (key)
);
CREATE INDEX strategies_role ON lease.strategies (role);
COMMENT ON TABLE lease.strategies IS
  'pg_lease internal: who a release hands a key to (lease.set_strategy); no row means any';

-- The listeners' pid index (the per-session bound, the clean-up).
-- listen returns whether its registration was already in place (boolean).
DROP FUNCTION IF EXISTS lease.listen(text);  -- (a 0.3.0 install has it)
-- inspect and list report a key that is not held (state, last_owner, since),
-- and list takes keys: the older functions go first.
DROP FUNCTION IF EXISTS lease.inspect(text);
DROP FUNCTION IF EXISTS lease.list();
CREATE INDEX listeners_pid ON lease.listeners (pid);

-- The promotion mode of lease.configure ('any' when NULL: a grace of max_ttl
-- after a promotion; 'synchronous': none).
ALTER TABLE lease.settings ADD COLUMN promotion text
  CHECK (promotion OPERATOR(pg_catalog.=) ANY (ARRAY['any', 'synchronous']::pg_catalog.text[]));

-- 06_search_path: every API function pins its search_path, so a caller's
-- search_path that shadows clock_timestamp() and now() (placed explicitly
-- before pg_catalog) does not change behaviour: grants still expire relative
-- to the real server time and lapse at the right time.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE SCHEMA regress_pglease_clock;
CREATE FUNCTION regress_pglease_clock.clock_timestamp() RETURNS timestamptz
  LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$;
CREATE FUNCTION regress_pglease_clock.now() RETURNS timestamptz
  LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$;
SET search_path = regress_pglease_clock, pg_catalog, public;
-- (a function that took the shadowing clock could wait forever: bound it)
SET statement_timeout = '10s';
-- the shadowing works for unqualified calls in this session
SELECT clock_timestamp() = '2000-01-01 00:00:00+00' AS shadowed_clock,
       now() = '2000-01-01 00:00:00+00' AS shadowed_now;

SELECT acquired, epoch,
       expires_at > pg_catalog.clock_timestamp() + interval '29s' AS expiry_from_real_now,
       expires_at < pg_catalog.clock_timestamp() + interval '31s' AS expiry_not_later
  FROM lease.acquire('sp-1', 'o1', interval '30s');
SELECT held, owner, epoch FROM lease.inspect('sp-1');
SELECT key, held, owner, epoch FROM lease.list() WHERE key = 'sp-1';
SELECT status, expires_at > pg_catalog.clock_timestamp() + interval '59s' AS expiry_from_real_now
  FROM lease.renew('sp-1', 'o1', 1, interval '60s');
SELECT lease.fence('sp-1', 'o1', 1) > pg_catalog.clock_timestamp() AS fence_ok;
SELECT acquired FROM lease.acquire('sp-1', 'o2', interval '30s');

-- a short grant lapses at its real expiry
SELECT acquired, epoch FROM lease.acquire('sp-2', 'o1', interval '0.3s');
SELECT held, owner, epoch FROM lease.inspect('sp-2');
SELECT status FROM lease.renew('sp-2', 'o1', 1, interval '0.3s');
SELECT pg_sleep(0.4);
SELECT held, owner, epoch FROM lease.inspect('sp-2');
SELECT status FROM lease.renew('sp-2', 'o1', 1, interval '30s');
SELECT acquired, epoch FROM lease.acquire('sp-2', 'o2', interval '30s');
SELECT status FROM lease.release('sp-2', 'o2', 2);
SELECT held, epoch FROM lease.inspect('sp-2');

-- a blocking acquire measures its wait on the real clock too
SELECT * FROM lease.acquire('sp-1', 'o2', interval '30s', interval '0.2s');

-- the stored times are real server times, not the shadowing year 2000
SELECT key, acquired_at > timestamptz '2020-01-01' AS real_acquired_at
  FROM lease.leases WHERE key LIKE 'sp-%' ORDER BY key;

RESET search_path;
RESET statement_timeout;
DROP SCHEMA regress_pglease_clock CASCADE;

-- 04_invalid_input: every invalid input raises invalid_input (SQLSTATE 22023)
-- with a DETAIL naming every violated constraint, and changes nothing.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('inv-1', 'o1', interval '30s');
CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;
SELECT pg_temp.state() AS s0 \gset

-- key and owner: not NULL, not empty, at most 1024 bytes
SELECT * FROM lease.acquire(NULL, 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('', 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire(repeat('k', 1025), 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', NULL, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', '', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', repeat('o', 1025), interval '30s');
\echo :LAST_ERROR_SQLSTATE
-- the limit is in bytes, not characters: 513 two-byte characters are too many
SELECT octet_length(repeat(chr(233), 513)) AS bytes;
SELECT * FROM lease.acquire(repeat(chr(233), 513), 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE

-- ttl: not NULL, positive, and server time + ttl must fit in timestamptz
SELECT * FROM lease.acquire('inv-2', 'o1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', 'o1', interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', 'o1', interval '-1s');
\echo :LAST_ERROR_SQLSTATE
-- a day is 86400 seconds: this interval is zero seconds long
SELECT * FROM lease.acquire('inv-2', 'o1', interval '1 day -86400 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', 'o1', interval '300000 years');
\echo :LAST_ERROR_SQLSTATE

-- wait: not NULL, not negative, and server time + wait must fit too
SELECT * FROM lease.acquire('inv-2', 'o1', interval '30s', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', 'o1', interval '30s', interval '-0.1s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('inv-2', 'o1', interval '30s', interval '300000 years');
\echo :LAST_ERROR_SQLSTATE

-- several violations at once: all are named, in argument order
SELECT * FROM lease.acquire(NULL, '', interval '0', interval '-1s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire(repeat('k', 2000), NULL, NULL, NULL);
\echo :LAST_ERROR_SQLSTATE

-- input is checked before state: an invalid call on a held key by its own
-- holder is still an error, not an idempotent success
SELECT * FROM lease.acquire('inv-1', 'o1', interval '0');
\echo :LAST_ERROR_SQLSTATE

-- renew: key, owner, epoch (not NULL, at least 1), ttl
SELECT * FROM lease.renew(NULL, 'o1', 1, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', '', 1, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', NULL, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', 0, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', -1, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', 1, interval '-5s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('inv-1', 'o1', 1, interval '300000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew(NULL, NULL, NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('', repeat('o', 1025), 0, interval '0');
\echo :LAST_ERROR_SQLSTATE

-- release: key, owner, epoch
SELECT * FROM lease.release(NULL, 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('inv-1', NULL, 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('inv-1', 'o1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('inv-1', 'o1', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('', '', 0);
\echo :LAST_ERROR_SQLSTATE

-- inspect: key
SELECT * FROM lease.inspect(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect('');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect(repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE

-- fence: key, owner, epoch (validated before any status check)
SELECT lease.fence(NULL, 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('inv-1', 'o1', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('', NULL, NULL);
\echo :LAST_ERROR_SQLSTATE

-- force_release: key
SELECT * FROM lease.force_release(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.force_release('');
\echo :LAST_ERROR_SQLSTATE

-- none of the calls above changed anything
SELECT pg_temp.state() = :'s0' AS unchanged;
SELECT count(*) AS rows_for_inv_2 FROM lease.leases WHERE key = 'inv-2';

-- the limits themselves are valid: a 1024-byte key and owner (ASCII or
-- multibyte), a tiny ttl, a zero wait
SELECT acquired, epoch FROM lease.acquire(repeat('k', 1024), repeat('o', 1024), interval '30s');
SELECT acquired, epoch FROM lease.acquire(repeat(chr(233), 512), 'o1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('inv-3', 'o1', interval '1 microsecond', interval '0');
SELECT status FROM lease.release(repeat('k', 1024), repeat('o', 1024), 1);

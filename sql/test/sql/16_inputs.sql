-- 16_inputs (0.3.0): inputs that used to pass validation and fail later now
-- fail at once with invalid_input (22023) and a DETAIL, changing nothing:
-- control characters in keys and owners (their JSON escapes could overflow
-- the 8000-byte NOTIFY payload), ttl + wait overflowing timestamptz after a
-- blocking wait, cleanup's free_for. And two documented edges: a lapsed
-- holder whose row clean-up removed is told not_owner, and the largest
-- possible notification fits.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql
AS $$ SELECT md5(coalesce(string_agg(l::text, ',' ORDER BY l.key), '')) FROM lease.leases l $$;
SELECT acquired, epoch FROM lease.acquire('in-1', 'o1', interval '30s');
SELECT pg_temp.state() AS s0 \gset

-- Control characters U+0001..U+001F and U+007F, in key or owner, in every function.
SELECT * FROM lease.acquire(E'in\n2', 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('in-2', E'o\t1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire(E'\x01', E'\x7f', interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire(repeat(E'\x1f', 400), repeat(E'\x01', 400), interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew(E'in-1\r', 'o1', 1, interval '30s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('in-1', E'o1\x1b', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence(E'in-1\x08', 'o1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect(E'in-1\x0c');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.force_release(E'\x7fin-1');
\echo :LAST_ERROR_SQLSTATE
-- with notifications off, too (0.2.0 let such a key in, and then a notifying
-- session could not release it)
SET pg_lease.notify = off;
SELECT * FROM lease.acquire(repeat(E'\x01', 1024), 'o1', interval '30s');
\echo :LAST_ERROR_SQLSTATE
RESET pg_lease.notify;

-- ttl + wait: each fits, the sum would overflow timestamptz once the wait
-- ends (the expiry is computed after the wait).
SELECT * FROM lease.acquire('in-2', 'o1', interval '1 hour',
                            wait => timestamptz '294276-12-31 23:59:59+00' - clock_timestamp() - interval '30 min');
\echo :LAST_ERROR_SQLSTATE
-- cleanup: server time - free_for must stay inside timestamptz
SELECT * FROM lease.cleanup(interval '10000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.cleanup(interval '-1 s', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.state() = :'s0' AS unchanged;
SELECT count(*) AS rows_for_in_2 FROM lease.leases WHERE key = 'in-2';
-- the largest free_for that fits is accepted (nothing that old)
SELECT removed FROM lease.cleanup(interval '6000 years');

-- Allowed: other characters, also beyond ASCII (C1 controls, U+2028, emoji),
-- which JSON leaves unescaped.
SELECT acquired FROM lease.acquire(E'in-\u0085-\u2028-ключ-\U0001F511', E'\u00e9', interval '30s');
SELECT status FROM lease.release(E'in-\u0085-\u2028-ключ-\U0001F511', E'\u00e9', 1);

-- The largest notification: a 1024-byte key of '"' and a 1024-byte owner of
-- '\' (each escaped to 2 bytes), the longest event, the largest epoch. It is
-- far below NOTIFY's 8000-byte limit, and such a key is acquired, renewed,
-- released and force-released with notifications on.
SELECT octet_length(json_build_object('event', 'force_released', 'key', repeat('"', 1024),
                                      'owner', repeat('\', 1024), 'epoch', 9223372036854775807)::text)
       AS largest_payload_bytes;
SELECT acquired, epoch FROM lease.acquire(repeat('"', 1024), repeat('\', 1024), interval '30s');
SELECT status FROM lease.renew(repeat('"', 1024), repeat('\', 1024), 1, interval '30s');
SELECT status FROM lease.release(repeat('"', 1024), repeat('\', 1024), 1);
SELECT acquired, epoch FROM lease.acquire(repeat('"', 1024), repeat('\', 1024), interval '30s');
SELECT released, epoch FROM lease.force_release(repeat('"', 1024));

-- Documented: clean-up forgets a lapsed grant, so its former holder is told
-- not_owner instead of lapsed (the row that remembered it is gone); the next
-- grant of the key is still above its epoch. In a transaction rolled back, so
-- the floor stays as it was for the files that follow.
BEGIN;
SELECT acquired, epoch FROM lease.acquire('in-lapse', 'o1', interval '0.1 s');
SELECT pg_sleep(0.15);
SELECT status FROM lease.renew('in-lapse', 'o1', 1, interval '30s');
SELECT removed > 0 AS removed FROM lease.cleanup(interval '0');
SELECT status FROM lease.renew('in-lapse', 'o1', 1, interval '30s');
SELECT status FROM lease.release('in-lapse', 'o1', 1);
SELECT acquired, epoch > 1 AS above_the_lapsed_grant FROM lease.acquire('in-lapse', 'o2', interval '30s');
ROLLBACK;

SELECT status FROM lease.release('in-1', 'o1', 1);
DELETE FROM lease.leases WHERE key LIKE 'in-%' OR key ~ '^"';

-- The overflow bound of a duration is measured from the clock at the call,
-- not from the transaction's start (0.6 s earlier here): a wait 0.7 s short
-- of the timestamptz range, measured from now, is too large for the wait
-- itself (not only together with the ttl).
BEGIN;
SELECT pg_sleep(0.6);
SELECT * FROM lease.acquire('in-bound', 'o', interval '1 s',
                            wait => (timestamptz '294276-12-31 23:59:59+00' - clock_timestamp()) - interval '0.7 s');
ROLLBACK;

-- A blocking acquire bounds its lock waits with lock_timeout for its own
-- duration only: the caller's setting (here a SET LOCAL) is back after the
-- call, and nothing is left for the session after the transaction.
BEGIN;
SET LOCAL lock_timeout = '5s';
SELECT acquired, epoch FROM lease.acquire('in-lt', 'o', interval '1 s', wait => interval '0.5 s');
SHOW lock_timeout;
COMMIT;
SHOW lock_timeout;
SELECT status FROM lease.release('in-lt', 'o', 1);

-- The ttl + wait bound too is measured from the clock at the call: in a
-- transaction 0.6 s old, a wait that is fine alone but 0.7 s short of the
-- range together with the ttl is too large.
BEGIN;
SELECT pg_sleep(0.6);
SELECT * FROM lease.acquire('in-bound2', 'o', interval '1 s',
                            wait => (timestamptz '294276-12-31 23:59:59+00' - clock_timestamp()) - interval '1.7 s');
ROLLBACK;

-- A wait-0 first grant sets lock_timeout (1 ms) for its insertion only: the
-- caller's own setting is back after the call.
BEGIN;
SET LOCAL lock_timeout = '5s';
SELECT acquired, epoch FROM lease.acquire('in-lt0', 'o', interval '1 s');
SHOW lock_timeout;
COMMIT;
SELECT status FROM lease.release('in-lt0', 'o', 1);

-- ... and so does a blocking takeover of a free key (in-lt was released).
BEGIN;
SET LOCAL lock_timeout = '5s';
SELECT acquired, epoch FROM lease.acquire('in-lt', 'o2', interval '1 s', wait => interval '0.5 s');
SHOW lock_timeout;
COMMIT;

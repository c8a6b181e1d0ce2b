-- R variant (scratch copy of lease.renew, never shipped): nonotify (function without pg_notify)
SELECT status FROM scratch.renew_nonotify('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

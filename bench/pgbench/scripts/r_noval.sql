-- R variant (scratch copy of lease.renew, never shipped): noval
SELECT status FROM scratch.renew_noval('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

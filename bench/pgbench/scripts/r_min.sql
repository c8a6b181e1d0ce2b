-- R variant (scratch copy of lease.renew, never shipped): min
SELECT status FROM scratch.renew_min('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

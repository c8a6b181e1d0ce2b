-- R variant (scratch copy of lease.renew, never shipped): nosubtx
SELECT status FROM scratch.renew_nosubtx('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

-- R variant (scratch copy of lease.renew, never shipped): nosp
SELECT status FROM scratch.renew_nosp('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

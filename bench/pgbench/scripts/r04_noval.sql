-- R candidate (scratch copy of the installed lease.renew, never shipped: bench/pgbench createRenewCandidates): noval
SELECT status FROM scratch.renew04_noval('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

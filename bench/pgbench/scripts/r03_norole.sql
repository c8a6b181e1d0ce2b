-- R candidate (scratch copy of the installed lease.renew, never shipped: bench/pgbench createRenewCandidates): norole
SELECT status FROM scratch.renew03_norole('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

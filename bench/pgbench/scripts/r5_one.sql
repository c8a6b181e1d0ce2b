-- R variant (scratch, never shipped): r5_one, see scratch.sql
SELECT status FROM scratch.r5_one('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

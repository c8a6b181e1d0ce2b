-- R variant (scratch, never shipped): r5_noplan, see scratch.sql
SELECT status FROM scratch.r5_noplan('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

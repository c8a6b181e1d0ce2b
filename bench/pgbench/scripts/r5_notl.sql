-- R variant (scratch, never shipped): r5_notl, see scratch.sql
SELECT status FROM scratch.r5_notl('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

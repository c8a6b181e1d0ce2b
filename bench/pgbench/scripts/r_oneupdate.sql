-- R variant (scratch, never shipped): oneupdate, see scratch.sql
SELECT status FROM scratch.renew_oneupdate('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

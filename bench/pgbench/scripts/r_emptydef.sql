-- R floor: an empty PL/pgSQL function with lease.renew's arguments and attributes (scratch.sql).
SELECT status FROM scratch.empty_definer('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

-- R floor: r_bare's UPDATE inside a PL/pgSQL function with lease.renew's attributes (scratch.sql).
SELECT status FROM scratch.update_definer('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

-- R: one renewal of a private held key (statement cost of the hot path).
SELECT status FROM lease.renew('r-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '1 h');

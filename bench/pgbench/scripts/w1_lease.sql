-- W1-cycle: acquire + renew + release of a private key, 3 statements, each its own (durable) commit.
SELECT epoch AS e FROM lease.acquire('w1-' || :client_id::text, 'c' || :client_id::text, interval '30 s') \gset
SELECT status FROM lease.renew('w1-' || :client_id::text, 'c' || :client_id::text, :e::bigint, interval '30 s');
SELECT status FROM lease.release('w1-' || :client_id::text, 'c' || :client_id::text, :e::bigint);

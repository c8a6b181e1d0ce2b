-- R baseline: the renewal as a hand-written conditional UPDATE.
UPDATE bench.bare SET expires_at = clock_timestamp() + interval '1 h'
 WHERE key = 'r-' || :client_id::text AND owner = 'c' || :client_id::text AND epoch = :e::bigint
   AND expires_at > clock_timestamp()
RETURNING expires_at;

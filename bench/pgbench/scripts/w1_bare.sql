-- W1 baseline: the same three state transitions as hand-written UPDATEs on a plain table of the same shape.
UPDATE bench.bare SET owner = 'c' || :client_id::text, epoch = epoch + 1,
       expires_at = clock_timestamp() + interval '30 s', acquired_at = clock_timestamp()
 WHERE key = 'w1-' || :client_id::text AND (owner IS NULL OR expires_at <= clock_timestamp())
RETURNING epoch AS e \gset
UPDATE bench.bare SET expires_at = clock_timestamp() + interval '30 s'
 WHERE key = 'w1-' || :client_id::text AND owner = 'c' || :client_id::text AND epoch = :e::bigint
   AND expires_at > clock_timestamp()
RETURNING expires_at;
UPDATE bench.bare SET owner = NULL, epoch = epoch + 1, expires_at = clock_timestamp()
 WHERE key = 'w1-' || :client_id::text AND owner = 'c' || :client_id::text AND epoch = :e::bigint;

-- W2 baseline: the same conditional grant as one UPDATE on a plain table of the same shape.
\set k random(1, 4)
UPDATE bench.bare SET owner = 'c' || :client_id::text, epoch = epoch + 1,
       expires_at = clock_timestamp() + interval '2 ms', acquired_at = clock_timestamp()
 WHERE key = 'w2-' || :k::text AND (owner IS NULL OR expires_at <= clock_timestamp())
RETURNING true AS acquired;

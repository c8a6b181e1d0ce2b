\set VERBOSITY default
\set SHOW_CONTEXT never
-- A sharded controller of 1,024 shards with 10 replicas under one role: a
-- runner-up registration per shard, two per shard while the members
-- change (the old runner-up has not withdrawn yet), an eleventh replica
-- joining with the registrations of the shards it will win, and the
-- priority strategy on every shard key: all within the role's bounds.
SELECT count(*) FILTER (WHERE r.status = 'ok') AS registered
  FROM generate_series(0, 1023) s, generate_series(1, 2) o,
       LATERAL lease.candidate('sc/shard/' || s, 'sc-replica-' || ((s + o) % 10), interval '30s', NULL, 1, true) r;
SELECT count(*) FILTER (WHERE r.status = 'ok') AS joiner
  FROM generate_series(0, 1023, 11) s,
       LATERAL lease.candidate('sc/shard/' || s, 'sc-replica-10', interval '30s', NULL, 2, true) r;
SELECT count(*) FILTER (WHERE p.previous = 'any') AS strategies
  FROM generate_series(0, 1023) s, LATERAL lease.set_strategy('sc/shard/' || s, 'priority') p;
SELECT count(*) AS candidates FROM lease.candidates WHERE key LIKE 'sc/shard/%';
SELECT count(*) AS strategy_rows FROM lease.strategies WHERE key LIKE 'sc/shard/%';
DELETE FROM lease.candidates WHERE key LIKE 'sc/shard/%';
DELETE FROM lease.strategies WHERE key LIKE 'sc/shard/%';

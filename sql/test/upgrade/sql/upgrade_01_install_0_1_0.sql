-- upgrade_01_install_0_1_0: the previous release, 0.1.0, in use, with keys in
-- every state. Runs first, in a database without the extension (pg_regress
-- without --load-extension); upgrade_02_update updates it in place. The run is
-- described in README.md next to this folder's expected/.
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_lease';
SELECT lease.version();
SELECT count(*) AS cleanup_functions FROM pg_proc
 WHERE pronamespace = 'lease'::regnamespace AND proname = 'cleanup';

-- held, epoch 1
SELECT acquired, epoch FROM lease.acquire('up-held', 'h1', interval '1h');
-- held at epoch 3 (acquire, release, acquire)
SELECT acquired, epoch FROM lease.acquire('up-held3', 'h3', interval '1h');
SELECT status FROM lease.release('up-held3', 'h3', 1);
SELECT acquired, epoch FROM lease.acquire('up-held3', 'h3', interval '1h');
-- free, counter 2
SELECT acquired, epoch FROM lease.acquire('up-free', 'f1', interval '1h');
SELECT status FROM lease.release('up-free', 'f1', 1);
-- five grants released: counter 10
DO $$
DECLARE e bigint;
BEGIN
  FOR i IN 1..5 LOOP
    SELECT a.epoch INTO e FROM lease.acquire('up-busy', 'b1', interval '1h') a;
    PERFORM lease.release('up-busy', 'b1', e);
  END LOOP;
END
$$;
-- force-released: counter 2
SELECT acquired, epoch FROM lease.acquire('up-forced', 'x1', interval '1h');
SELECT released, previous_owner, epoch FROM lease.force_release('up-forced');
-- lapsed (not taken over), and lapsed then taken over (epoch 2; the row
-- remembers the grant the takeover ended)
SELECT acquired, epoch FROM lease.acquire('up-lapsed', 'l1', interval '200ms');
SELECT acquired, epoch FROM lease.acquire('up-taken', 'l1', interval '200ms');
SELECT pg_sleep(0.3);
SELECT acquired, epoch FROM lease.acquire('up-taken', 't2', interval '1h');

SELECT key, held, owner, epoch FROM lease.list() ORDER BY key;
SELECT key, owner, epoch, lapsed_owner, lapsed_epoch FROM lease.leases ORDER BY key;

-- The rows exactly as 0.1.0 left them, for upgrade_02_update to compare.
CREATE TABLE upgrade_before AS SELECT * FROM lease.leases;

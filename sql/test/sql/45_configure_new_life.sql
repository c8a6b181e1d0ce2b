-- 45_configure_new_life (0.5.0): lease.configure on a server life that no
-- call has recorded yet (the first call after a promotion or a restart).
-- Grants the old life made may still be believed, and the new life may have
-- lost them, so lease.leases showing no grant held proves nothing: configure
-- records the new life first, with its grace from the settings in force
-- before the change. Before, a lowered max_ttl applied at once there, and the
-- grace the next call started was the lowered one. (Found by the model in
-- specs/model: caseConfigureBeforePromotionSeen.) A restart is simulated by
-- moving the recorded postmaster start after the server's, so that the grace
-- runs from the call.
\set VERBOSITY default
\set SHOW_CONTEXT never

DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT configured_max_ttl FROM lease.configure(max_ttl => '2 hours');
-- No grant held (as on a standby that lost the old life's last grants).
SELECT count(*) AS rows FROM lease.leases;
UPDATE lease.timeline_state SET started = started + interval '1 min';
-- Lowering max_ttl: the new life is recorded first, with a grace of 2 hours.
SELECT configured_max_ttl, promotion_grace FROM lease.configure(max_ttl => '1 hour');
SELECT restarts, grace_until > clock_timestamp() + interval '1 hour 59 min' AS grace_of_two_hours
  FROM lease.timeline_state ORDER BY era DESC, restarts DESC LIMIT 1;
-- A new grant waits for that grace; the denial says when it ends.
SELECT acquired, epoch, expires_at > clock_timestamp() + interval '1 hour 59 min' AS denied_for_two_hours
  FROM lease.acquire('cnl-1', 'n', interval '30 s');
-- One state row for the change.
SELECT era, restarts, count(*) AS state_rows FROM lease.timeline_state GROUP BY era, restarts ORDER BY era, restarts;

-- A configure that changes nothing (both NULL) records nothing.
UPDATE lease.timeline_state SET started = started + interval '1 min';
SELECT configured_max_ttl FROM lease.configure();
SELECT era, restarts, count(*) AS state_rows FROM lease.timeline_state GROUP BY era, restarts ORDER BY era, restarts;

-- The next tests start from a fresh install.
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;

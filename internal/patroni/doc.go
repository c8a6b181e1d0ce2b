// Package patroni runs a throwaway PostgreSQL cluster managed by Patroni for
// tests: one etcd (Patroni's DCS, through its etcd3 section) and N Patroni
// nodes, each with its own PostgreSQL data directory, port, REST API port and
// pgpass file, all on 127.0.0.1. Nothing is mocked: the failovers are
// Patroni's own.
//
//	c, err := patroni.Start(ctx, patroni.Options{Mode: patroni.Strict,
//		Etcd: etcdBinary, Supervise: superviseBinary})
//	defer c.Close()
//	leader, err := c.WaitHealthy(ctx)    // a primary, every replica streaming
//	dsn := c.MultiHostDSN("postgres")    // target_session_attrs=read-write
//	err = c.Switchover(ctx, leader, c.Nodes()[1]) // patronictl switchover --force
//	err = leader.Kill()                  // SIGKILL of Patroni and the postmaster tree
//	err = leader.Freeze(); leader.Thaw() // SIGSTOP / SIGCONT of both
//	err = leader.Start(ctx)              // Patroni again on the same data directory
//	err = leader.KillPatroni()           // SIGKILL of Patroni alone: PostgreSQL keeps running
//	err = c.StopEtcd(); c.StartEtcd(ctx) // the DCS lost, then back on the same data and ports
//
// # Modes
//
// Async: asynchronous streaming replicas. Sync: Patroni's synchronous_mode
// (one synchronous standby; Patroni promotes only a synchronous standby, and
// replication falls back to asynchronous when no standby is left). Strict:
// synchronous_mode plus synchronous_mode_strict (commits wait while no
// synchronous standby is connected; a new primary starts with
// synchronous_standby_names = '*').
//
// # Processes
//
// Patroni refuses nothing as root, but PostgreSQL does: when this process is
// root, Patroni (and so PostgreSQL) runs as nobody:nogroup and the cluster's
// directory belongs to that user. Patroni starts the postmaster the way
// pg_ctl does, through a process that exits at once, so the postmaster is
// orphaned. Each Patroni therefore runs under the supervise program of this
// package (built by the caller: Options.Supervise), a child subreaper that
// reaps the postmaster and its backends, so that a killed postmaster never
// stays a zombie whose pid Patroni would take for a running server. The
// supervisor is a child of this process with SIGTERM as its parent-death
// signal, and passes that on to Patroni, which stops PostgreSQL.
//
// Timing defaults suit tests: ttl 5 s, loop_wait 1 s, retry_timeout 2 s (so
// a crashed primary's leader key expires within 5 s), maximum lag on
// failover 1 MB, and wal_retrieve_retry_interval 250 ms (a standby
// reconnects to a new primary within that, not within 5 s: in strict mode
// the new primary's commits wait for it).
package patroni

// Package lease is the Go client of pg_lease's SQL API (lease.acquire,
// renew, release, inspect, list, fence) and Term, the held-grant primitive
// on which pkg/elector, pkg/resourcelock and pkg/shard are built.
//
// # Layers
//
// This is the one description of how pkg/ is layered; it is the import
// graph (go list -f '{{.ImportPath}} {{.Imports}}' ./pkg/...). Each package
// imports only the ones below it, and none imports internal/, cmd/, test/
// or examples/:
//
//	pkg/leaderelection  component-base config and --leader-elect* flags, the
//	  |                 controller-runtime manager glue (Fenced, metrics, events)
//	  v
//	pkg/resourcelock    client-go resourcelock.Interface over one key; the
//	  |                 one timing rule (Timing)
//	  |   pkg/elector   leader election for plain Go services
//	  |   pkg/shard     active-active controllers over many keys
//	  |   pkg/fence     write guards (InTx, PGGuard)
//	  |   pkg/leasemetrics  a Prometheus collector of every key
//	  v     v
//	pkg/listen          the listener (Waiter) and the one wake policy (Await)
//	pkg/handover        an elector's or a lock's candidacy (lease's candidate calls)
//	pkg/leaseadmin      install, settings, history, health, force-release, cleanup
//	  v
//	pkg/lease           the client, Term (the one held-grant primitive),
//	                    CheckMargin (the one margin rule); imports only pgx and
//	                    k8s.io/utils' clock
//
// pkg/listen, pkg/handover and pkg/leaseadmin take a *Client and use only
// its public API. What is pg_lease's protocol is this package's: the
// candidates and strategies of a handover (Client.RegisterCandidate,
// SetStrategy, Candidates, ...; pkg/handover names them for electors and
// locks), the operator's writes (Client.ForceRelease, Cleanup; pkg/leaseadmin
// checks the install, then calls them on Client.TrustInstall; without it
// they refuse), and the error mapping of every
// call (WrapError, for code that reads pg_lease's functions on a Querier of
// its own). pkg/elector imports neither pkg/leaseadmin nor the SQL scripts.
//
// # The client
//
// The client never decides ownership: every answer comes from the SQL
// functions, and the server's epoch and expiry are carried back unchanged.
// A Client runs on anything that can query: a *pgxpool.Pool, a single
// *pgx.Conn, or the caller's own pgx.Tx (so that a grant commits or rolls
// back with the caller's transaction). Fence asserts a grant inside the
// caller's transaction and keeps it until that transaction ends.
//
// A pool's connections are best warmed as they open (pgxpool.Config's
// AfterConnect = WarmConn): the first call of each function on a backend
// compiles it, which would otherwise fall on a handoff (the leader's one
// release, the successor's first grant).
//
// Errors: renew, release and fence failures match ErrLost and exactly one of
// ErrNotOwner, ErrLapsed, ErrEpochMismatch. Server errors match
// ErrInvalidInput, ErrWaitTimeout, ErrInvalidIsolation, ErrNotInstalled,
// ErrReadOnly (a standby or read-only session) or ErrPermission, and
// errors.As reaches the *pgconn.PgError with the server's DETAIL.
//
// Acknowledged means replicated: acquire, renew and release never report a
// change whose commit's wait for the synchronous standbys was cancelled
// (PostgreSQL reports it as success, with a warning); they return
// ErrCommitUnknown instead, and do not retry it. That holds on any pool or
// connection; ObserveCommits on the connections' configuration saves two
// round trips per change (commit.go says why and how).
//
// During the grace after a promotion or, from SQL 0.5.0, a restart of the
// server (no new grant of any key until it ends) Acquire returns a *GraceError (ErrGrace) that says when it ends, and
// listen.WaitOutGrace sleeps until then: the end writes nothing, so no
// notification wakes anyone for it. leaseadmin.ReadSettings reads the
// database's max_ttl, promotion mode and grace.
//
// A call that fails on a dead connection (SQLSTATE class 08, a terminated
// backend, an EOF) while its context is alive is sent once more, for
// acquire without a server-side wait, renew, release, and inspect: each is
// idempotent or conditional on owner and epoch, so the retry cannot take or
// extend anything the first attempt did not (retryOnce says why, call by
// call). A pool then hands the retry a new connection; this is what lets a
// graceful release survive one dead pooled connection.
//
// # Time: one clock, one formula, one margin
//
// Every local instant is read from the Client's clock (the real one, or a
// fake through WithClock: deadlines and margins are testable without a
// server). A server instant becomes a local one by one formula (roundTrip):
// the server read its clock between a request's send and its reply's
// receipt, so with equal clock rates the server shows instant x locally
// somewhere in [send + (x − serverNow), receipt + (x − serverNow)]:
//
//   - Grant.ValidUntil is the earliest bound of the grant's expiry: the
//     grant is certainly held until then (the holder's view);
//   - State.ExpiresLocal is the latest bound: the grant has certainly
//     expired by then unless renewed (the follower's view; waking there is
//     never early).
//
// This is A1, written once here: a process that stops acting under a grant
// at ValidUntil − margin never overlaps its successor, which the server
// grants only after the expiry. The margin (CheckMargin, the one rule, used
// by every term) covers what ValidUntil does not: the clocks' rate
// difference over one TTL (the drift floor, TTL/1000 = 1000 ppm, twice what
// NTP may slew; no smaller margin is accepted) and the scheduling delay
// between the deadline and the code under the term observing it (timer
// latency, a loaded CPU, a GC pause: 100 ms in the default min(TTL/3,
// 100 ms + TTL/1000)). A process that is stopped (SIGSTOP, a VM pause)
// cannot act on a cancellation until it runs again; fence the writes that
// matter (pkg/fence): the epoch of a late write is lower than its
// successor's.
//
// # Term
//
// A Term (Client.Begin) is one grant as this process holds it: the grant,
// its local deadline (ValidUntil − margin), a context carrying the token
// (Context), Renew (which extends only a live term, and never after the
// deadline passed), Release, End and Done. It ends exactly once, with one
// cause: ErrLocalDeadline, ErrReleased, or the server's error (matching
// ErrLost). At or after the deadline, Renew and Release end it with
// ErrLocalDeadline whether or not its deadline timer has run yet: the cause
// does not depend on scheduling. Ending cancels every context of the term synchronously, then
// reports the end (Begin's onEnd), then closes Done; Release and End return
// only after the report. So a user that begins the next term only after the
// previous one's Release, End or Done reports "N ended" before "N+1 began".
// A context made from a done parent, or of an ended term, is done when
// Context returns; its Deadline is the term's.
//
// KeepAlive renews a term on the client's clock until its context or the
// term ends, and returns the term's cause; KeepAliveSet renews a changing
// set of terms in one statement per round (lease.renew_many). Both run
// the one renew loop of the repository at the one default cadence,
// RenewInterval (a third of the TTL): pkg/elector and pglease lock keep a
// term alive with KeepAlive, and keep no loop of their own.
//
// # Waiting and installing
//
// Waiting for a key to change (a release, a grant, an expiry) is
// pkg/listen's job: one listener per process and one wake policy, Await.
// Installing pg_lease is pkg/leaseadmin's (InstallExtension, InstallSchema).
package lease

// Package lease is the Go client of pg_lease's SQL API (lease.acquire,
// renew, release, inspect, list, fence, force_release, cleanup), its
// installer, the held-grant primitive Term on which pkg/elector and
// pkg/resourcelock are built, and Waiter, the process's one listener.
//
// # Layers
//
// This is the one description of how pkg/ is layered; it is the import
// graph (go list -f '{{.ImportPath}} {{.Imports}}' ./pkg/...). Each package
// imports only the ones below it, and none imports internal/, cmd/, test/
// or examples/:
//
//	pkg/leaderelection  component-base config and --leader-elect* flags, the
//	  |                 controller-runtime manager glue (NewManager,
//	  |                 Fenced, metrics, events)
//	  v
//	pkg/resourcelock    client-go resourcelock.Interface over one key; the
//	  |                 one timing rule (Lock.LeaderElectionConfig)
//	  |   pkg/elector   leader election for plain Go services
//	  |   pkg/fence     write guards (InTx, PGGuard)
//	  |   pkg/leasemetrics  a Prometheus collector of every key (History, Health)
//	  v     v
//	pkg/lease           the client, the installer, Term (the one held-grant
//	                    primitive), Waiter (the one listener), CheckMargin
//	                    (the one margin rule); imports only pgx, k8s.io/utils'
//	                    clock and the embedded SQL scripts (package sql)
//
// pkg/elector, pkg/resourcelock, pkg/fence and pkg/leasemetrics import pkg/lease only;
// pkg/leaderelection imports pkg/resourcelock and pkg/lease. pkg/elector and
// pkg/resourcelock are thin users of Term and Waiter.Await; pkg/fence
// guards writes with a Token.
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
// Acknowledged means replicated: with ObserveCommits on the connections'
// configuration, acquire, renew and release never report a change whose
// commit's wait for the synchronous standbys was cancelled (PostgreSQL
// reports it as success, with a warning); they return ErrCommitUnknown
// instead, and do not retry it (commit.go says why and how).
//
// During the grace after a promotion (no new grant of any key until it
// ends) Acquire returns a *GraceError (ErrGrace) that says when it ends, and
// WaitOutGrace sleeps until then: the end writes nothing, so no Waiter wakes
// for it. Settings reads the database's max_ttl, promotion mode and grace.
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
// ErrLost). Ending cancels every context of the term synchronously, then
// reports the end (Begin's onEnd), then closes Done; Release and End return
// only after the report. So a user that begins the next term only after the
// previous one's Release, End or Done reports "N ended" before "N+1 began".
// A context made from a done parent, or of an ended term, is done when
// Context returns; its Deadline is the term's.
//
// # The Waiter: one listener, one wake policy
//
// A Waiter holds one dedicated connection (not from a pool: it must stay
// LISTENing), runs LISTEN pg_lease, re-establishes the connection after any
// loss (exponential backoff with jitter between ReconnectMin and
// ReconnectMax; a connection silent for a minute is checked with a query),
// and fans notifications out to Watch subscribers. pg_lease notifies on
// channel pg_lease, at commit, for every grant, release and force_release
// (not renewals, not lapses: expiry is lazy), with a JSON payload {event,
// key, owner, epoch} — since 0.3.0, by default (pg_lease.notify = waiters),
// only for keys some backend registered with lease.listen. The Waiter
// registers every key a Watch (and so an Await) waits for on its connection,
// each in its own short transaction and before the subscription reads
// anything ('*' for a Watch of every key), drops a key with lease.unlisten
// a second after its last subscription ends, and registers everything again
// after a reconnection, before the EventResync. Awaits of one key woken by
// the same notification share one read. Events are at-most-once: after a
// reconnection, or when a subscriber's channel was full, it receives an Event
// of Type "resync" and should re-read the state.
//
// Waiter.Await is the module's one wake policy for "wait until this key
// may have changed": it subscribes, reads the key (one inspect), and reads
// again only on a notification for the key or a resync, at the observed
// grant's ExpiresLocal (a lapse sends nothing), or after poll (which bounds
// how late a change is seen when no notification can arrive: a nil or
// closed Waiter, pg_lease.notify = off on the writer, a transaction-pooling
// proxy that drops LISTEN). Each read has a deadline (QueryTimeout). pkg/elector's
// followers and pkg/resourcelock's waiting Get use it.
//
// A2, the detection latency (from a key becoming free on the server to a
// waiter seeing it): after a release, the notification's delivery plus one
// inspect; after an expiry, the local timer's error (at most the read's
// round trip, plus timer slack) plus one inspect; with notifications
// unavailable, up to poll. BenchmarkA2 measures the first two.
//
// # Installing
//
// InstallExtension runs CREATE EXTENSION IF NOT EXISTS pg_lease (the server
// needs the files of sql/). InstallSchema installs the same SQL, embedded in
// this module, as a plain schema, for managed PostgreSQL that allow-lists
// extensions: the objects, privileges and functions are the same; only
// DROP EXTENSION and ALTER EXTENSION UPDATE are unavailable (drop schema
// lease instead; InstallSchema itself runs the update scripts on an older
// schema install, and refuses a newer one with ErrVersionMismatch). Both are
// idempotent, run in one transaction, and are safe to race: the loser of a
// concurrent install retries and finds the winner's. Installed tells which is
// present.
package lease

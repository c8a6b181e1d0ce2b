// Package lease is the Go client of pg_lease's SQL API (lease.acquire,
// renew, release, inspect, list, fence, force_release), its installer, and
// a Waiter that waits for keys without blind polling.
//
// # The client
//
// The client never decides ownership: every answer comes from the SQL
// functions, and the server's epoch and expiry are carried back unchanged.
// What the client adds is a local, conservative view of how long a grant is
// certainly still held: Grant.ValidUntil, measured on this process's
// monotonic clock from the moment the request was sent. The server reads its
// clock after deciding, and reports expires_at minus that reading as the time
// left; the decision cannot precede the send, so send + left is never later
// than the server's expiry as seen from here, whatever the two wall clocks
// say (only their rates matter). This is A1: a process that stops acting
// under a grant at ValidUntil − margin never overlaps its successor, where
// the margin covers the clocks' rate difference over one TTL (ppm: tens of
// µs per minute) and this process's own scheduling delay between checking
// the time and acting (GC pauses, a loaded CPU: choose it from what the
// host shows, typically 100 ms–1 s).
//
// A Client runs on anything that can query: a *pgxpool.Pool, a single
// *pgx.Conn, or the caller's own pgx.Tx (so that a grant commits or rolls back
// with the caller's transaction). Fence asserts a grant inside the caller's
// transaction and keeps it until that transaction ends.
//
// Errors: renew, release and fence failures match ErrLost and exactly one of
// ErrNotOwner, ErrLapsed, ErrEpochMismatch. Server errors match
// ErrInvalidInput, ErrWaitTimeout, ErrInvalidIsolation or ErrNotInstalled,
// and errors.As reaches the *pgconn.PgError with the server's DETAIL.
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
//
// # The Waiter
//
// A Waiter holds one dedicated connection (not from a pool: it must stay
// LISTENing), runs LISTEN pg_lease on it, and serves every Acquire of every
// goroutine from one goroutine that owns the connection: attempts run there
// one after another, between waits for notifications. pg_lease sends a
// notification on channel pg_lease, at commit, for every grant, release and
// force_release (not for renewals), with a JSON payload {event, key, owner,
// epoch}.
//
// One waiting Acquire goes through these states:
//
//	       Acquire
//	          |
//	          v
//	+----> ATTEMPT ----- granted -----> return Grant
//	|         |  \
//	|         |   `---- server error --> return error (ErrInvalidInput, ErrNotInstalled, ...)
//	|       denied
//	|         |  inspect: holder's expiry E, server clock S
//	|         v
//	|      WAITING  (ctx ends -> return ctx's error; a grant won in that
//	|         |      instant is released)
//	|         | the earliest of:
//	|         |  (a) a released/force_released notification for the key
//	|         |  (b) E on the local clock: offset-converted, clamped into
//	|         |      [sent+(E-S), recv+(E-S)] of the inspect's round trip,
//	|         |      and never early after an early wake (recv+(E-S))
//	|         |  (c) the fallback poll: recv + FallbackPoll
//	|         |  (d) the listen connection came back (every key re-checked)
//	+---------'
//
// The server-clock offset is the server's clock_timestamp() minus the local
// midpoint of the round trip that read it (best of three), so it is right
// within half that round trip; it is measured at every (re)connection and
// every ClockRefresh. A renewal by the holder moves E later: the waiter
// wakes at the old E, is denied, and learns the new E, one extra attempt
// per renewal period at most. Notifications are not needed for the wake at
// expiry.
//
// The fallback poll covers the cases where a release sends no
// notification that reaches the waiter: the releasing session set
// pg_lease.notify = off; the waiter's connection goes through a
// transaction-pooling proxy (PgBouncer in transaction mode accepts LISTEN but
// the session does not stay on one server connection, so nothing arrives);
// or notifications were sent while the connection was down (a reconnection
// re-checks every key anyway). Without notifications a release is seen
// within FallbackPoll; an expiry is always seen at once.
//
// The connection is re-established after any loss (a terminated backend, a
// server restart, a network failure, a query exceeding QueryTimeout), with
// exponential backoff and jitter between ReconnectMin and ReconnectMax;
// waiting Acquire calls keep waiting through it. Waits for notifications
// are interrupted with socket deadlines, never with cancel requests, so an
// interrupted wait cannot cancel the next query.
//
// Watch subscribes to the notifications as Events (for the CLI's watch).
// Events are at-most-once: after a reconnection, or when a subscriber's
// channel was full, it receives EventResync and should re-read the state.
//
// # A2
//
// A2 is the detection latency: from the instant a key becomes free on the
// server (a release commits, or the holder's grant expires) to the instant
// a waiter holds it. For Client.Acquire (no wait) it is 0: the next call
// after expiry succeeds. For a Waiter it is the wake mechanism's latency:
// after a release, the notification's delivery plus one acquire round trip;
// after an expiry, the error of the local timer (the offset's uncertainty,
// at most half a round trip, and timer slack) plus one round trip; with
// notifications unavailable, up to FallbackPoll after a release. The
// benchmark BenchmarkA2 in this package measures the first two, p50 and
// p99.
package lease

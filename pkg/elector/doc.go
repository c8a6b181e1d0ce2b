// Package elector is leader election for plain Go services over pg_lease:
// no Kubernetes API server, one PostgreSQL database, and a fencing epoch
// handed to the leader with every term.
//
//	client := lease.New(pool)
//	el, err := elector.New(client, elector.Config{
//		Key: "billing-scheduler",
//		Callbacks: elector.Callbacks{
//			OnStartedLeading: func(ctx context.Context) {
//				// ctx carries the term's fencing token and is cancelled
//				// before the grant can expire on the server.
//				runScheduler(ctx) // writes through fence.InTx or a guard
//			},
//		},
//	})
//	...
//	err = el.Run(ctx) // until ctx ends; then releases, handing off at once
//
// # States
//
//	             Run(ctx)
//	                │
//	                ▼
//	┌──────────► CAMPAIGN ◄─────────────────────────────────────────┐
//	│   acquire: denied → listen.Await: read the holder              │
//	│   (OnNewLeader), wait for its release or its expiry (poll     │
//	│   every RetryInterval), try again                             │
//	│               │ acquire: granted, epoch E > every epoch        │
//	│               │ this elector led under                         │
//	│               ▼                                                │
//	│            LEADING (term E)                                    │
//	│   OnNewLeader(self, E); go OnStartedLeading(leaderCtx);        │
//	│   renew every RenewInterval (RetryInterval after a failure)    │
//	│               │ leaderCtx cancelled, cause (lease's term causes):│
//	│               │  lease.ErrLocalDeadline  no renewal succeeded    │
//	│               │                     before the local deadline   │
//	│               │  lease.ErrLost…     renew answered lapsed,      │
//	│               │                     not_owner, epoch_mismatch   │
//	│               │  lease.ErrReleased  Run's ctx ended, or         │
//	│               │                     OnStartedLeading returned   │
//	│               ▼                                                │
//	│            STOPPING (term E)                                   │
//	│   wait for OnStartedLeading to return (when resigning, renew   │
//	│   meanwhile, then release E); OnStoppedLeading()               │
//	│               │                                                │
//	└───────────────┴── ctx done? Run returns nil ──── otherwise ────┘
//
// # Trust window
//
// Each term is a lease.Term: the leader context is the term's context
// (lease.Term.Context), cancelled at the term's local deadline,
//
//	deadline = Grant.ValidUntil − Margin
//
// of the latest successful acquire or renewal, unless a later renewal
// succeeds first; a renewal whose answer arrives after the deadline does
// not revive the term. Why that never overlaps a successor (A1), and what
// Margin covers (the one margin rule, lease.CheckMargin: clock-rate drift
// over one grant, at least TTL/1000, and scheduling delay; default
// min(TTL/3, 100 ms + TTL/1000), 115 ms for the default 15 s TTL) is
// written once, in package lease. Raise Margin when the work under the
// leader context reacts to cancellation more slowly; what it does after the
// deadline anyway is what fencing is for.
//
// Timings (validated by New): RenewInterval ≤ TTL/3 and Margin ≤ TTL/3, so
// after a successful renewal at least TTL/3 remains before the deadline for
// retries every RetryInterval (≤ RenewInterval). Every renew call is bounded
// by the deadline. Timers run on the client's clock (lease.Client.WithClock).
//
// # Terms and epochs
//
// Within one elector, term E+1 starts (OnStartedLeading is called for it)
// only after term E's leader context was cancelled, its OnStartedLeading
// returned and OnStoppedLeading returned; the next term is never started
// under an epoch it already led under: when the server still holds the
// previous grant (a term that ended on its local deadline within Margin of
// the expiry, or a renewal the server applied after the elector had given
// up on it), the elector releases that grant and acquires a new one.
//
// Across processes the server orders terms: a grant of another candidate
// starts only after the previous grant was released (the release is sent
// only after the old term's OnStartedLeading returned) or expired (after
// the old term's deadline). OnStartedLeading must therefore return promptly
// after its context is cancelled; while a term is still running more than
// HealthTolerance past its deadline, Check fails.
//
// # Failure handling
//
//   - Renewal fails without a verdict (connection lost, timeout, server
//     frozen or down): retry every RetryInterval until the deadline; then
//     cancel the term (lease.ErrLocalDeadline), wait for OnStartedLeading, and
//     campaign again. No release is attempted: the grant expires on its own
//     within Margin.
//   - Renewal answered lapsed, not_owner or epoch_mismatch (the grant
//     expired on the server, was force-released or taken over): cancel the
//     term at once (the lease error), no release, campaign again.
//   - Run's context ends: cancel the term (lease.ErrReleased wrapping the
//     context's cause), keep renewing until OnStartedLeading returns, then
//     release, so a follower takes over without waiting for the TTL, and
//     return nil. A grant obtained as the context ends is released too,
//     including one the server committed after the connection gave up on
//     the call (found by reading the key for this identity).
//   - OnStartedLeading returns while the term is valid: resign (release)
//     and campaign again after RetryInterval, which gives candidates woken
//     by the release the first chance.
//   - Acquire or inspect fail: retry after RetryInterval. pg_lease not
//     installed, or a version or input the server refuses, end Run with the
//     error.
//   - The key is held under this elector's identity by a grant the server
//     refuses to it (owner strings are not authenticated; grants are bound
//     to the database role that took them): after one more acquire to rule
//     out a handover in flight, the elector follows that grant as another
//     holder's, at the follower's cadence, until the key changes hands.
//     It counts identity_taken and logs it at most once a minute;
//     Status.IdentityTaken is true meanwhile.
//
// Followers wait with listen.Await: woken by the release's
// notification when Config.Waiter is set (the process's one listener on
// channel pg_lease, which pg_lease notifies on grants, releases, handovers
// and force-releases; the wake reads the key, since any role may send a
// notification), at the
// observed grant's expiry on the local clock
// (lease.State.ExpiresLocal: a lapse sends nothing), and otherwise every
// RetryInterval. Without a Waiter, a release is seen within RetryInterval;
// an expiry within a round trip. A takeover after a holder died therefore
// takes at most TTL (from its last renewal) plus that latency.
//
// # Observability
//
// Status reports the current view; Check has the shape of
// controller-runtime's healthz.Checker; the Prometheus metrics, registered
// on Config.Registerer (controller-runtime's metrics.Registry to serve them
// beside a manager's, or any prometheus.Registerer; the series are listed
// there), export the leader status, the epoch led under, renew latency,
// transitions and errors by kind (acquire, inspect, renew, release,
// register, lapsed, not_owner, epoch_mismatch, deadline, identity_taken).
// The leader context's cause (context.Cause) says why a term ended.
package elector

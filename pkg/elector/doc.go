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
//	│   acquire: denied → inspect the holder (OnNewLeader),         │
//	│   wait for its release or its expiry (Waiter, or poll         │
//	│   every RetryInterval), try again                             │
//	│               │ acquire: granted, epoch E > every epoch        │
//	│               │ this elector led under                         │
//	│               ▼                                                │
//	│            LEADING (term E)                                    │
//	│   OnNewLeader(self, E); go OnStartedLeading(leaderCtx);        │
//	│   renew every RenewInterval (RetryInterval after a failure)    │
//	│               │ leaderCtx cancelled, cause:                    │
//	│               │  ErrRenewDeadline   no renewal succeeded before │
//	│               │                     the local deadline          │
//	│               │  ErrLeadershipLost  renew answered lapsed,      │
//	│               │                     not_owner, epoch_mismatch   │
//	│               │  ErrResigned        Run's ctx ended, or         │
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
// Every grant is timed on this process's monotonic clock from the instant
// its request was sent: lease.Grant.ValidUntil is send time plus the time
// the server said was left (expires_at minus the server's clock read after
// its decision). The server cannot have decided before the request was
// sent, so with equal clock rates the server's expiry is later than
// ValidUntil. The leader context is cancelled at
//
//	deadline = ValidUntil - Margin
//
// of the latest successful acquire or renewal, unless a later renewal
// succeeds first; a renewal whose answer arrives after the deadline does
// not revive the term. Margin covers what ValidUntil does not:
//
//   - clock-rate drift between this host's monotonic clock and the server's
//     clock over one grant: at most MaxClockRateDrift (1000 ppm) × TTL,
//     twice what NTP may slew; New refuses a smaller Margin;
//   - scheduling: from the deadline timer firing to the code under the
//     leader context having observed the cancellation (timer latency, a
//     loaded CPU, a GC pause): SchedulingMargin, 100 ms.
//
// The default is min(TTL/3, 100 ms + TTL/1000): 115 ms for the default 15 s
// TTL. Raise it when the work under the leader context reacts to
// cancellation more slowly; what it does after the deadline anyway is what
// fencing is for.
//
// So A1 (how long a lapsed holder may still believe it holds the lease) is
// zero on the server's timeline for this elector: its belief ends at least
// Margin − drift before the expiry, and a successor can only be granted
// after the expiry. The bound needs the process to run: a process that is
// stopped (SIGSTOP, a VM pause, a host suspend, whose CLOCK_MONOTONIC does
// not advance) cannot act on a cancellation until it runs again, and then
// the leader context is cancelled at once, but a write it had already
// decided may still go out. Fence every write that matters (package
// fence): the epoch of such a write is lower than its successor's and the
// guard rejects it.
//
// Timings (validated by New): RenewInterval ≤ TTL/3 and Margin ≤ TTL/3, so
// after a successful renewal at least TTL/3 remains before the deadline for
// retries every RetryInterval (≤ RenewInterval). Every renew call is bounded
// by the deadline.
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
//     cancel the term (ErrRenewDeadline), wait for OnStartedLeading, and
//     campaign again. No release is attempted: the grant expires on its own
//     within Margin.
//   - Renewal answered lapsed, not_owner or epoch_mismatch (the grant
//     expired on the server, was force-released or taken over): cancel the
//     term at once (ErrLeadershipLost), no release, campaign again.
//   - Run's context ends: cancel the term (ErrResigned wrapping the
//     context's cause), keep renewing until OnStartedLeading returns, then
//     release, so a follower takes over without waiting for the TTL, and
//     return nil.
//   - OnStartedLeading returns while the term is valid: resign (release)
//     and campaign again after RetryInterval, which gives candidates woken
//     by the release the first chance.
//   - Acquire or inspect fail: retry after RetryInterval. pg_lease not
//     installed, or a version or input the server refuses, end Run with the
//     error.
//
// Followers wake when the key is released (the Waiter: LeaseWaiter over a
// lease.Waiter listens on channel pg_lease, which pg_lease NOTIFYs on
// every change) and at the observed grant's expiry
// (measured on the local clock from the inspect answer's receipt), and
// otherwise poll every RetryInterval. Without a Waiter, a release is seen
// within RetryInterval; an expiry within a round trip. A takeover after a
// holder died therefore takes at most TTL (from its last renewal) plus
// that latency.
//
// # Observability
//
// Status reports the current view; Check has the shape of
// controller-runtime's healthz.Checker; Metrics (NewMetrics, or
// ctrlmetrics.New for controller-runtime's registry) exports the leader
// status, the epoch led under, renew latency, transitions and errors by
// kind. The leader context's cause (context.Cause) says why a term ended.
package elector

// Package resourcelock is a client-go resourcelock.Interface over one
// pg_lease key, so that client-go's leader election (and controller-runtime's
// manager, through Options.LeaderElectionResourceLockInterface) elects its
// leader through PostgreSQL instead of the Kubernetes API, and so that what
// runs under the leadership can carry the grant's epoch as a fencing token.
//
//	lock, err := resourcelock.New(lease.New(pool), "my-controller", podName,
//		resourcelock.WithLeaseDuration(15*time.Second))
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: lock, ReleaseOnCancel: true,
//		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
//		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(ctx context.Context) {
//			ctx, cancel, err := lock.TokenContext(ctx) // done when this epoch ends
//			...
//		}},
//	})
//
// # LeaderElectionRecord ↔ lease row
//
// pg_lease stores (key, owner, epoch, expires_at) and decides every change on
// the server's clock. The record client-go sees is built from lease.inspect:
//
//	record field          from the lease                      written by Update/Create
//	HolderIdentity        owner while held, "" when free      own identity (acquire/renew) or "" (release)
//	LeaseDurationSeconds  Options.LeaseDuration, rounded up   ignored: the TTL sent is Options.LeaseDuration
//	LeaderTransitions     the key's epoch counter             ignored: the server counts
//	AcquireTime/RenewTime zero (pg_lease keeps server times)  ignored: only the server's clock counts
//	Strategy/PreferredHolder  empty                           ignored (coordinated election unsupported)
//
// The raw bytes Get returns are JSON of {key, epoch, holder, expiresAt}, all
// values a holder's write sets: a grant changes the epoch, a renewal the
// server expiry, a release the epoch and the holder. Nothing computed at read
// time (server now, remaining TTL, "held") is in them, so client-go followers,
// which time a holder's expiry by how long the bytes stay unchanged on their
// own clock, see a change exactly when a holder writes. A lapse is not a
// write: inspect stops naming a lapsed holder, and the Lock then returns the
// bytes of the last write it saw for that epoch. (A Lock that never saw the
// grant, such as a new process, reads a lapsed key as free at its epoch.)
//
// # Operations
//
//	Get     lease.inspect. A key never leased (or removed by lease.cleanup
//	        once free): apierrors.IsNotFound.
//	Create  lease.acquire of a key that does not exist (epoch 1, or above
//	        the epoch floor lease.cleanup keeps). An existing key, held or
//	        free: apierrors.IsAlreadyExists, nothing changes.
//	Update  no resourceVersion; conditional on what the Lock holds:
//	          HolderIdentity ""            → lease.release(key, identity, epoch)
//	          a live term of epoch e        → lease.renew(key, identity, e, ttl)
//	          no grant                     → lease.acquire(key, identity, ttl):
//	                                         a takeover if free or lapsed
//	        The server's "not yours" (acquire denied, renew or release
//	        answering lapsed, not_owner or epoch_mismatch) is a Conflict
//	        (apierrors.IsConflict; errors.Is also finds the lease error).
//	        A release the server refuses is a plain error (client-go retries
//	        a release only on Conflict, and there is nothing to retry).
//
// # Terms and the epoch-change rule
//
// Every grant the Lock obtains starts a Term: one epoch, with a context that
// carries the token and is done when the term ends. States of a Lock:
//
//	        Create/Update: acquire ok
//	none ──────────────────────────────▶ live(e) ──┐ Update: renew ok
//	 ▲                                      │  ▲───┘ (deadline moves)
//	 │ release / server says lost           │
//	 │   (Update or Get)                    │ local deadline passes
//	 └──────────────────────────────────────┤ (ValidUntil − Margin)
//	 ▲                                      ▼
//	 └──── next Update: release e ─── ended(e), grant kept
//	       (then Conflict)
//
// After the server answers lapsed, not_owner or epoch_mismatch for epoch e,
// the Lock never reports success for e again: the grant is forgotten, and a
// later Update acquires, which the server only grants under a greater epoch.
// The same holds for a term that ended at its local deadline: the Lock gives
// that grant back instead of resuming it.
//
// client-go's elector cannot see epochs: it renews through Update and, when
// a renewal fails, falls back to Get and Update, which for the same identity
// re-acquires. A lapse followed by re-acquisition by the same identity is
// therefore, for the elector, a continuation of its leadership (its leader
// context stays alive), but it is a new epoch. The Lock enforces the rule
// "whenever the epoch under which a process acts changes, everything that
// acted under the old epoch is told (cancelled) before anything is handed
// the new one" itself:
//
//   - the old term's context, and every context from TokenContext derived
//     from it, is cancelled synchronously when the term ends;
//   - Options.OnEpochChange is then called with (old, zero);
//   - only after that can a new grant be obtained (Get, Create and Update
//     run one at a time, and a term ends before its grant is dropped); the
//     new term is reported to OnEpochChange with (zero, new) before the
//     Update returns and before Term, Token or TokenContext return it.
//
// So code that acts under the leadership must take its token from the Lock
// (Term, Token, TokenContext; the controller glue does that per reconcile),
// not once at OnStartedLeading. A program that prefers to stop altogether
// when its epoch ends can cancel the elector's context from OnEpochChange.
//
// # Trust window (A1)
//
// A term is trusted until Grant.ValidUntil − Options.Margin, on this
// process's monotonic clock: ValidUntil is the instant the acquire or renew
// was sent plus the time the server said was left, so it comes before the
// server's expiry when both clocks run at the same rate. The margin (default
// LeaseDuration/10, at most 1s) covers clock-rate drift and a late timer. A
// timer ends the term there unless a renewal moved it; a renewal that comes
// back after it does not revive the term. Term.Valid and Lock.Token also
// check the deadline, so a late timer never extends the window.
//
// # Identity
//
// Identities must be unique per candidate: pg_lease's acquire is idempotent
// for the holder, so two processes sharing an identity would share a grant.
// A Lock whose identity already holds the key (for example after a crash
// and restart within the TTL) adopts that grant on its next acquire: the
// server returns the current epoch, and no term of this Lock saw it before.
//
// The lease.Client should run on a pool (autocommit), not in a caller's
// transaction: a grant must be committed when Update returns.
package resourcelock

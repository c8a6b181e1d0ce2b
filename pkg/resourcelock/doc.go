// Package resourcelock is a client-go resourcelock.Interface over one
// pg_lease key, so that client-go's leader election (and controller-runtime's
// manager, through Options.LeaderElectionResourceLockInterface) elects its
// leader through PostgreSQL instead of the Kubernetes API, and so that what
// runs under the leadership can carry the grant's epoch as a fencing token.
//
//	w, _ := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{}) // one per process
//	lock, err := resourcelock.New(lease.New(pool), resourcelock.Config{
//		Key: "my-controller", Identity: podName, LeaseDuration: 15 * time.Second, Waiter: w})
//	cfg, err := lock.LeaderElectionConfig(leaderelection.LeaderElectionConfig{
//		ReleaseOnCancel: true, // timings 0: 15s/10s/2s from the lock
//		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(ctx context.Context) {
//			ctx, cancel, err := lock.TokenContext(ctx) // done when this epoch ends
//			...
//		}},
//	})
//	leaderelection.RunOrDie(ctx, cfg)
//
// # LeaderElectionRecord ↔ lease row
//
// pg_lease stores (key, owner, epoch, expires_at) and decides every change on
// the server's clock. The record client-go sees is built from lease.inspect:
//
//	record field          from the lease                      written by Update/Create
//	HolderIdentity        owner while held, "" when free      own identity (acquire/renew) or "" (release)
//	                      (own identity + TakenSuffix: held
//	                      under it by another session)
//	LeaseDurationSeconds  the lock's lease duration, rounded up   ignored: the TTL sent is the lock's
//	LeaderTransitions     the key's epoch counter             ignored: the server counts
//	AcquireTime/RenewTime zero (pg_lease keeps server times)  ignored: only the server's clock counts
//	Strategy/PreferredHolder  empty                           ignored (coordinated election unsupported)
//
// The raw bytes Get returns are JSON of {key, epoch, holder, expiresAt} of
// the key's state on the server: a grant changes the epoch, a renewal the
// server expiry, a release the epoch and the holder, and a lapse (decided
// by the server: inspect no longer names a lapsed holder) the holder, to
// none. Nothing computed at read time (server now, remaining TTL) is in
// them, so the bytes change when the key's state changes on the server and
// never because of a read, and every lock reads the same bytes for the same
// state. A lapsed key therefore reads as free: a follower takes over at the
// server's expiry, not after its own LeaseDuration.
//
// # Operations
//
//	Get     lease.inspect. A key never leased (or removed by lease.cleanup
//	        once free): apierrors.IsNotFound. A follower's Get waits for
//	        news (below). A key held under this lock's identity by a
//	        grant that is not one of its terms: also lease.fence, once per
//	        epoch (see Identity). Get changes nothing on the server.
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
//	        a release only on Conflict, and there is nothing to retry). An
//	        Update before any Get or Create is refused (BadRequest).
//
// # The waiting Get
//
// With Config.Waiter, a follower's Get (the lock holds no grant, and the
// record it last returned does not name this identity) waits, through
// listen.Await (the module's one wake policy), until the record differs
// from the last one it returned in what matters to an election: the holder
// or the epoch (a grant, a release, a takeover, the server-side lapse of the
// grant; a renewal is not news). It is woken by the release's notification
// (then it reads the record: any role may send a notification, so what one
// says is never returned), by the observed grant's expiry on
// the local clock, and by a poll of
// min(LeaseDuration/2, 1s) (which covers a lost listen connection or
// pg_lease.notify = off without missing a release); it returns at the
// latest after maxFollowerWait (10 minutes) with the current record, and at
// once with ctx's error when ctx ends. The first Get, and every Get of the
// holder, never wait; neither do Create and Update.
//
// A candidate (Config.Candidacy) differs in two ways. Its first Get waits
// too while another identity holds the key. And it renews its registration
// inside the wait, when due and as soon as its readiness changes, instead
// of returning. After any Get returns, client-go sleeps a RetryPeriod; a
// grant handed to the candidate during that sleep would wait for the next
// Get, 2 to 4.4 s at the default timings.
//
// Why each way client-go (tools/leaderelection/leaderelection.go, v0.37)
// calls the lock stays correct:
//
//   - acquire loop (wait.JitterUntilWithContext, RetryPeriod, no deadline):
//     tryAcquireOrRenew calls Get; as a follower it now blocks there until
//     news, so a release or a lapse is acted on at once (Update → acquire)
//     instead of at the next jittered retry. When Run's context ends, the
//     Get returns its error and client-go's loop ends, as before.
//   - renew loop (wait.PollUntilContextTimeout, RenewDeadline): the leader's
//     fast path is Update (renew); the slow path's Get is the holder's and
//     does not wait. If the lock lost its grant, the record it last
//     returned still names this identity, so that Get does not wait either;
//     a later one may, bounded by the RenewDeadline context: client-go then
//     stops leading after RenewDeadline, as it would have polling.
//   - release on cancel (tryRelease: Get, then Update with no holder, under
//     a fresh RenewDeadline context): the holder's Get does not wait; the
//     release is retried once on a connection-level error
//     (lease.Client.Release), since client-go itself retries only on
//     Conflict and a dead pooled connection would otherwise make the
//     successor wait the whole TTL.
//   - health check (LeaderElector.Check, HealthzAdaptor): reads client-go's
//     own observed time, and only for the leader, whose calls never wait.
//   - OnNewLeader: fed from Get's records; a waiting Get returns on every
//     change of holder, so new leaders are still reported.
//
// Each follower call (Get's reads, Create, an acquiring Update) has a
// deadline of max(LeaseDuration, 1s) of its own, so that a silently dead
// TCP connection cannot stall client-go's acquire loop (whose context has
// none) for minutes. Without a Waiter, Get returns at once and
// client-go's followers poll every RetryPeriod.
//
// # Timings
//
// One rule, Timing, ties client-go's timings to the lock's lease duration
// (the TTL). Besides client-go's own rules (which RunOrDie would panic on),
// it requires RenewDeadline + RetryPeriod below the lock's lease duration
// minus its margin: client-go ends its leader context only after a whole
// RenewDeadline round, started RetryPeriod after the last successful
// renewal, has failed, and with a longer sum that context outlives the
// grant on the server. New checks the Config's timings (Config.RenewDeadline
// and RetryPeriod; left zero: client-go's 15s/10s/2s proportions of the
// lease duration) with it, together with the rest of the Config, once;
// each offence is a *FieldError naming its field. LeaderElectionConfig
// fills a client-go configuration's zero timings with the lock's and checks
// the ones set against the same rule.
//
// # Terms and the epoch-change rule
//
// Every grant the Lock obtains starts a lease.Term: one epoch, with a
// context that carries the token and is done when the term ends (A1, the
// margin rule and the deadline are package lease's). States of a Lock:
//
//	        Create/Update: acquire ok
//	none ──────────────────────────────▶ live(e) ──┐ Update: renew ok
//	 ▲                                      │  ▲───┘ (deadline moves)
//	 │ release / server says lost           │
//	 │   (Update or Get)                    │ local deadline passes
//	 └──────────────────────────────────────┤ (ValidUntil − margin)
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
// A grant is valid for the lease duration from when its call was sent. When
// the answer comes with less than half of it left (the call waited: on a
// new primary in synchronous mode every commit waits until a standby
// streams from it), Create and Update renew it at once, before they return,
// so that the term lasts until client-go's next renewal instead of ending
// before it. A grant whose answer came after its local deadline is never
// handed out: it is given back and the key asked for once more at once,
// and Create or Update reports that second answer (a new epoch, or
// Conflict).
//
// The cause a term ends with (context.Cause of its contexts) is decided by
// what the Lock saw, not by which goroutine noticed first. Once the term's
// local deadline has passed, it is lease.ErrLocalDeadline: a renewal
// answered after it, or one whose renewed grant is already past its own
// deadline (the server's clock jumped during the call), a Get that finds
// the grant gone, client-go's "stopped leading", and the give-back of an
// ended term all report the deadline, whether or not the deadline timer
// has run yet. Before the
// deadline, the server's answer that the grant is gone reports that answer
// (lease.ErrLapsed, lease.ErrNotOwner, lease.ErrEpochMismatch), and only a
// release (an Update with an empty HolderIdentity) reports
// lease.ErrReleased.
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
//   - the old term's contexts, and every TokenContext made from it, are
//     cancelled synchronously when the term ends;
//   - Config.OnEpochChange is then called with (old, zero);
//   - only after that can a new grant be obtained: Get, Create and Update
//     run one at a time, and a Lock acting on an ended term waits until its
//     end has been reported (lease.Term); the new term is reported with
//     (zero, new) before the Update returns and before Token or
//     TokenContext return it.
//
// The end of client-go's leadership is an end of the term too: its elector
// records "stopped leading" (RecordEvent) when a renewal failed for
// RenewDeadline, even while the grant is still valid on the server, and
// the Lock then ends the term (ErrStoppedLeading) and gives the grant back
// at the next Update, so that the next leadership of the same identity
// carries a new epoch.
//
// So code that acts under the leadership must take its token from the Lock
// (Token, TokenContext; the controller glue does that per reconcile), not
// once at OnStartedLeading. A program that prefers to stop altogether when
// its epoch ends can cancel the elector's context from OnEpochChange.
//
// # Identity
//
// Identities must be unique per candidate: pg_lease's acquire is idempotent
// for the holder, so two processes sharing an identity under one database
// role would share a grant. A Lock whose identity already holds the key
// (for example after a crash and restart within the TTL, or a handover to
// its candidate) adopts that grant on its next acquire: the server returns
// the current epoch, and no term of this Lock saw it before.
//
// Owner strings are public and not authenticated; a grant is bound to the
// database role that took it, and pg_lease refuses it to any other role.
// client-go believes it leads whenever the record's HolderIdentity is its
// identity (LeaderElector.IsLeader), so a Get that finds the key held under
// this lock's identity by a grant that is not one of its terms asks the
// server whose it is (lease.fence as this role, once per epoch). When the
// grant is another session's, the record names the holder as the identity
// followed by TakenSuffix: client-go sees another leader, neither reports
// itself leader nor starts leading, and follows until the key changes
// hands; a waiting Get treats that record as any other holder's. The fence
// read waits for a row lock another transaction holds on the key, at most
// max(LeaseDuration, 1s); Get then returns the error.
//
// The lease.Client should run on a pool (autocommit), not in a caller's
// transaction: a grant must be committed when Update returns.
package resourcelock

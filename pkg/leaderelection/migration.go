package leaderelection

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pg_lease/pkg/resourcelock"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// migrationLock is the resource lock "leases+pglease": a client-go
// resourcelock.Interface over two locks with one identity, the
// coordination.k8s.io Lease (Lease, client-go's LeaseLock) and the pg_lease
// key (Lock). A candidate using it leads only while it holds both, so
// during a rolling update from "leases" old pods (Lease only) and new pods
// (both) never lead at once: whoever leads holds the Lease, and client-go's
// LeaseLock lets only one process hold it. A later rollout to "pglease"
// drops the Lease: new pods of both kinds then exclude each other through
// the pg_lease key.
//
// It is a composite lock rather than a wrapper around the elector because
// client-go's elector (and controller-runtime's manager, which accepts only
// a resourcelock.Interface) must stay the one deciding leadership: a wrapper
// would need an elector of its own and could not be handed to a manager.
//
// The order is fixed: acquire and renew the Lease first, then the pg_lease
// key; release the pg_lease key first, then the Lease. Operations:
//
//	Get     Lease.Get (NotFound → NotFound: the elector then Creates), then
//	        Lock.Get (NotFound → the key is free). The record is the
//	        Lease's, with HolderIdentity chosen so that a candidate never
//	        sees itself as holder unless it holds both:
//	          Lease holder ""                → the pg_lease holder (or "")
//	          Lease holder H, key free or H  → H
//	          Lease holder is this candidate,
//	          key held by another K          → K
//	          Lease holder H, key held by K  → H
//	        LeaseDurationSeconds is the larger of the two. The raw bytes are
//	        the Lease's raw record, a comma, and the pg_lease lock's: they
//	        change whenever either lock is written, so followers time a
//	        holder's expiry from the last write to either.
//	Create  Lease.Create (AlreadyExists is returned as is), then the key:
//	        Lock.Create, or Lock.Update (an acquire) when it exists.
//	Update  HolderIdentity "": Lock.Update (release; nothing held is not
//	        an error), then Lease.Update (release).
//	        Otherwise Lease.Update, and only if it succeeded Lock.Update.
//	        A failure of the second step leaves the Lease held but the
//	        candidate not leading (the elector saw an error); the next Get
//	        reports the key's holder, so it waits for that holder's lease to
//	        go stale (or, if the key is free, takes it at the next retry).
//
// Get never waits for news, and Lock must be built without
// resourcelock.Config.Waiter (NewResourceLock builds it so): the Lease half is what keeps
// old pods out, and client-go's elector learns that a Lease holder is gone
// only by reading the Lease every RetryPeriod and seeing the same record
// for LeaseDuration. A waiting pg_lease Get returns only when the key
// changes; while an old pod holds the Lease the key may never change
// (nobody takes it), so the follower would sit in Get (up to the lock's
// ten-minute bound) long after the Lease went stale, and every Lease write
// it did not see would be missing from its record. Handoffs in this mode
// therefore take client-go's polling time, as with "leases"; the
// millisecond handoff comes with the switch to "pglease".
//
// The epoch (fencing token) is the pg_lease lock's: use Lock.Token,
// TokenContext or Fenced(Lock, …) as with "pglease".
type migrationLock struct {
	Lease rl.Interface
	Lock  *resourcelock.Lock
}

var _ rl.Interface = (*migrationLock)(nil)

// NewMigrationLock returns the "leases+pglease" lock (see migrationLock):
// the composite of lease and pg, which must have the same identity.
// NewResourceLock builds it from a Config; this is for a program that
// builds both halves itself.
func NewMigrationLock(lease rl.Interface, pg *resourcelock.Lock) (rl.Interface, error) {
	if lease == nil || pg == nil {
		return nil, fmt.Errorf("%w: NewMigrationLock: both locks are required", ErrInvalidConfig)
	}
	if lease.Identity() != pg.Identity() {
		return nil, fmt.Errorf("%w: NewMigrationLock: the Lease lock's identity %q differs from the pg_lease lock's %q",
			ErrInvalidConfig, lease.Identity(), pg.Identity())
	}
	return &migrationLock{Lease: lease, Lock: pg}, nil
}

// Get reads both locks; see the type's documentation.
func (m *migrationLock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	lrec, lraw, err := m.Lease.Get(ctx)
	if err != nil {
		return nil, nil, err
	}
	prec, praw, err := m.Lock.Get(ctx)
	switch {
	case apierrors.IsNotFound(err):
		prec, praw = &rl.LeaderElectionRecord{}, nil
	case err != nil:
		return nil, nil, err
	}
	rec := *lrec
	switch lh, ph := lrec.HolderIdentity, prec.HolderIdentity; {
	case lh == "":
		rec.HolderIdentity = ph
	case ph == "" || ph == lh:
		rec.HolderIdentity = lh
	case lh == m.Identity():
		rec.HolderIdentity = ph
	default:
		rec.HolderIdentity = lh
	}
	rec.LeaseDurationSeconds = max(lrec.LeaseDurationSeconds, prec.LeaseDurationSeconds)
	return &rec, bytes.Join([][]byte{lraw, praw}, []byte(",")), nil
}

// Create creates the Lease, then obtains the pg_lease key.
func (m *migrationLock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	if err := m.Lease.Create(ctx, ler); err != nil {
		return err
	}
	return m.takeKey(ctx, ler)
}

func (m *migrationLock) takeKey(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := m.Lock.Create(ctx, ler)
	if apierrors.IsAlreadyExists(err) {
		err = m.Lock.Update(ctx, ler)
	}
	if err != nil {
		return fmt.Errorf("the Lease is held, the pg_lease key is not: %w", err)
	}
	return nil
}

// Update renews or acquires (Lease, then key) or releases (key, then
// Lease).
func (m *migrationLock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		perr := m.Lock.Update(ctx, ler)
		if errors.Is(perr, resourcelock.ErrNotHolding) {
			perr = nil // nothing held in PostgreSQL: still release the Lease
		}
		lerr := m.Lease.Update(ctx, ler)
		if lerr != nil {
			// A Conflict makes client-go Get and retry the release; return it
			// as is so that apierrors.IsConflict sees it.
			if perr != nil {
				return fmt.Errorf("%w (and releasing the pg_lease key: %v)", lerr, perr)
			}
			return lerr
		}
		return perr
	}
	if err := m.Lease.Update(ctx, ler); err != nil {
		return err
	}
	return m.Lock.Update(ctx, ler)
}

// RecordEvent records through the pg_lease lock, whose events name the
// epoch (give it an EventObject naming the Lease to see them on the Lease).
func (m *migrationLock) RecordEvent(s string) { m.Lock.RecordEvent(s) }

// Describe names both locks.
func (m *migrationLock) Describe() string {
	return resourceLockMigration + "/" + m.Lease.Describe() + "+" + m.Lock.Describe()
}

// Identity is the identity both locks share.
func (m *migrationLock) Identity() string { return m.Lock.Identity() }

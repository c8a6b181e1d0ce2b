package lease

import (
	"context"
	"fmt"
	"math"
	"time"
)

// The operator's writes. They run only on a client told that the install
// is trusted (TrustInstall); otherwise they return ErrInstallNotChecked.
// pkg/leaseadmin's ForceRelease and Cleanup check the install, then call
// them: they are what an operator's tool should call.

// ForceRelease frees key whatever its holder and moves its epoch past the
// current grant, fencing the former holder (lease.force_release, revoked
// from PUBLIC). released is false when the key was not granted (never
// leased, or already free). A commit whose wait for the synchronous
// standbys was cancelled returns ErrCommitUnknown: run it again once the
// standbys are back. It runs only on a TrustInstall client (else
// ErrInstallNotChecked); operators call leaseadmin.ForceRelease.
func (c *Client) ForceRelease(ctx context.Context, key string) (released bool, previousOwner string, epoch int64, err error) {
	if !c.checked {
		return false, "", 0, fmt.Errorf("force_release: %w", ErrInstallNotChecked)
	}
	var prev *string
	var ep *int64
	t := Token{Key: key}
	err = c.onConn(ctx, "force_release", func() Token { return t }, func(q Querier) error {
		return q.QueryRow(ctx, `SELECT f.released, f.previous_owner, f.epoch FROM lease.force_release($1) f`, key).
			Scan(&released, &prev, &ep)
	})
	if err != nil {
		// mapError returns a commit-unknown error unchanged.
		return false, "", 0, mapError("force_release", t, err)
	}
	return released, deref(prev), deref(ep), nil
}

// Cleanup is lease.cleanup (revoked from PUBLIC): it deletes at most
// maxRows keys that have been free (released, or lapsed and not taken
// over) for at least freeFor, first raising the database's epoch floor to
// the highest epoch it deletes, so that a key that comes back still gets a
// greater epoch than it ever had. It returns how many keys it removed and
// the floor afterwards. It runs only on a TrustInstall client (else
// ErrInstallNotChecked); operators call leaseadmin.Cleanup.
func (c *Client) Cleanup(ctx context.Context, freeFor time.Duration, maxRows int) (removed, epochFloor int64, err error) {
	if !c.checked {
		return 0, 0, fmt.Errorf("cleanup: %w", ErrInstallNotChecked)
	}
	if err := CheckCleanup(freeFor, maxRows); err != nil {
		return 0, 0, err
	}
	err = c.db.QueryRow(ctx, `SELECT c.removed, c.epoch_floor FROM lease.cleanup($1, $2) c`, freeFor, maxRows).
		Scan(&removed, &epochFloor)
	if err != nil {
		return 0, 0, mapError("cleanup", Token{}, err)
	}
	return removed, epochFloor, nil
}

// CheckCleanup checks Cleanup's arguments before anything is sent: freeFor
// 0 or at least 1µs, maxRows within PostgreSQL's integer range. The error
// matches ErrInvalidInput.
func CheckCleanup(freeFor time.Duration, maxRows int) error {
	if err := checkTTL("cleanup", Token{}, "freeFor", freeFor, true); err != nil {
		return err
	}
	if maxRows > math.MaxInt32 {
		return fmt.Errorf("cleanup: %w: maxRows %d is above PostgreSQL's integer range", ErrInvalidInput, maxRows)
	}
	return nil
}

package leaseadmin

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pglease/pg_lease/pkg/internal/leasecore"
	"github.com/pglease/pg_lease/pkg/lease"
)

// ForceRelease frees key whatever its holder and moves its epoch past the
// current grant, fencing the former holder. It needs EXECUTE on
// lease.force_release, which is revoked from PUBLIC. released is false when
// the key was not granted (never leased, or already free). A commit whose
// wait for the synchronous standbys was cancelled returns
// lease.ErrCommitUnknown: run it again once the standbys are back. It calls
// nothing unless the current role can trust the install (Describe): else it
// returns an error matching ErrSquatted.
func ForceRelease(ctx context.Context, c *lease.Client, key string) (released bool, previousOwner string, epoch int64, err error) {
	if _, err := trusted(ctx, leasecore.DB(c), "force_release"); err != nil {
		return false, "", 0, err
	}
	var prev *string
	var ep *int64
	err = leasecore.OnConn(c, ctx, "force_release", key, func(q leasecore.Querier) error {
		return q.QueryRow(ctx, `SELECT f.released, f.previous_owner, f.epoch FROM lease.force_release($1) f`, key).
			Scan(&released, &prev, &ep)
	})
	if err != nil {
		// MapError returns a commit-unknown error unchanged.
		return false, "", 0, leasecore.MapError("force_release", key, "", err)
	}
	if prev != nil {
		previousOwner = *prev
	}
	if ep != nil {
		epoch = *ep
	}
	return released, previousOwner, epoch, nil
}

// Cleanup is lease.cleanup: it deletes at most maxRows keys that have been
// free (released, or lapsed and not taken over) for at least freeFor, first
// raising the database's epoch floor to the highest epoch it deletes, so
// that a key that comes back still gets a greater epoch than it ever had.
// It returns how many keys it removed and the floor afterwards. It needs
// EXECUTE on lease.cleanup, which is revoked from PUBLIC
// (lease.ErrPermission). It calls nothing unless the current role can trust
// the install (Describe): else it returns an error matching ErrSquatted.
func Cleanup(ctx context.Context, c *lease.Client, freeFor time.Duration, maxRows int) (removed, epochFloor int64, err error) {
	if err := leasecore.CheckTTL("cleanup", "", "freeFor", freeFor, true); err != nil {
		return 0, 0, err
	}
	if maxRows > math.MaxInt32 {
		return 0, 0, fmt.Errorf("cleanup: %w: maxRows %d is above PostgreSQL's integer range", lease.ErrInvalidInput, maxRows)
	}
	if _, err := trusted(ctx, leasecore.DB(c), "cleanup"); err != nil {
		return 0, 0, err
	}
	err = leasecore.DB(c).QueryRow(ctx, `SELECT c.removed, c.epoch_floor FROM lease.cleanup($1, $2) c`, freeFor, maxRows).
		Scan(&removed, &epochFloor)
	if err != nil {
		return 0, 0, leasecore.MapError("cleanup", "", "", err)
	}
	return removed, epochFloor, nil
}

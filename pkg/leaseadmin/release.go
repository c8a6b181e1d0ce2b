package leaseadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
	if _, err := trusted(ctx, c.Querier(), "force_release"); err != nil {
		return false, "", 0, err
	}
	return c.TrustInstall().ForceRelease(ctx, key)
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
	if err := lease.CheckCleanup(freeFor, maxRows); err != nil {
		return 0, 0, err
	}
	in, err := trusted(ctx, c.Querier(), "cleanup")
	if err != nil {
		return 0, 0, err
	}
	removed, epochFloor, err = c.TrustInstall().Cleanup(ctx, freeFor, maxRows)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42883" {
		return 0, 0, &VersionError{Op: "cleanup", Function: "lease.cleanup", Since: "0.2.0", Installed: in.Version, err: err}
	}
	return removed, epochFloor, err
}

// VersionError: the installed pg_lease has no function that a call needs
// (it predates it). It matches lease.ErrNotInstalled and reaches the
// server's *pgconn.PgError (errors.As).
type VersionError struct {
	Op       string
	Function string // the missing function, lease.cleanup
	Since    string // the first version that has it
	// Installed is the installed version ("" for a plain schema).
	Installed string

	err error
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("%s: the installed pg_lease %s has no %s (added in %s)", e.Op, e.Installed, e.Function, e.Since)
}

func (e *VersionError) Unwrap() error { return e.err }

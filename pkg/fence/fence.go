// Package fence guards writes with pg_lease fencing tokens, so that a
// process that lost its lease (paused, partitioned, slow) cannot overwrite
// the work of its successor.
//
// A fencing token is (key, owner, epoch); epochs of a key strictly increase
// from grant to grant. Two kinds of guard:
//
//   - Same database as the leases: InTx runs the caller's writes in one
//     transaction after lease.Fence asserted, under a share lock on the
//     lease row, that the token is the current, unexpired grant. A takeover
//     or release must wait for that lock, so the check and the writes
//     commit together or not at all: no successor can commit in between.
//
//   - Any other store: the store remembers the highest epoch it has
//     accepted for a resource and refuses lower ones, as a conditional
//     write (`... WHERE epoch <= $epoch`). PGGuard does this for a table in
//     any PostgreSQL database (a fence_epochs table, or an epoch column on
//     the caller's own rows); another store must keep the watermark next to
//     its data and compare and write atomically (a conditional put, a
//     compare-and-swap). A writer whose epoch is lower than one already
//     accepted gets an error matching ErrStale.
//
// An external guard orders writers by epoch, not by time: a stale writer
// that writes before its successor's first guarded write is accepted (its
// lease may already have lapsed). Keep the successor's first action a
// guarded write, or use InTx when the data lives with the leases.
//
// Keep fenced transactions short: the share lock taken by lease.Fence also
// delays the holder's own renewals until the transaction ends.
package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
)

// ErrStale matches every rejection of a write whose token is not (or no
// longer) allowed to write: a lower epoch than the store accepted
// (*StaleError), or, for InTx, a token that is not the current grant (the
// error then also matches lease.ErrLost and its specific sentinel).
var ErrStale = errors.New("fence: stale fencing token")

// StaleError is PGGuard's rejection.
type StaleError struct {
	Resource string
	// Epoch is the rejected token's epoch; Highest the highest epoch the
	// store has accepted for Resource.
	Epoch, Highest int64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: write to %q with epoch %d rejected: epoch %d already accepted", e.Resource, e.Epoch, e.Highest)
}

// Is makes a *StaleError match ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// lostError is InTx's rejection: it matches ErrStale and the lease error.
type lostError struct{ err error }

func (e *lostError) Error() string   { return "fence: " + e.err.Error() }
func (e *lostError) Unwrap() []error { return []error{ErrStale, e.err} }

// InTx begins a transaction on db (in the database that holds the leases),
// calls lease.Fence for token, runs fn and commits. From Fence until the
// commit, the lease row is share-locked: no takeover or release of the key
// can commit in between, so fn's writes commit only under a grant that was
// current when they committed. When the token is not the current grant,
// fn is not called and the error matches ErrStale and lease.ErrLost. An
// error from fn rolls the transaction back and is returned as is. On a
// connection opened with lease.ObserveCommits, a commit whose wait for the
// synchronous standbys was cancelled returns lease.ErrCommitUnknown: the
// writes may be lost by a failover.
func InTx(
	ctx context.Context,
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	},
	token lease.Token,
	fn func(tx pgx.Tx) error,
) error {
	return beginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := lease.Fence(ctx, tx, token); err != nil {
			if errors.Is(err, lease.ErrLost) {
				return &lostError{err}
			}
			return err
		}
		return fn(tx)
	})
}

// beginFunc is pgx.BeginFunc committing through lease.Commit: on a
// connection opened with lease.ObserveCommits, a commit whose wait for the
// synchronous standbys was cancelled returns lease.ErrCommitUnknown, not nil.
func beginFunc(
	ctx context.Context,
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	},
	fn func(tx pgx.Tx) error,
) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && err == nil {
			err = rerr
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	return lease.Commit(ctx, tx)
}

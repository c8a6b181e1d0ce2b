package lease

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// NewWaiterWithHook is NewWaiter with a hook that the waiter's goroutine
// calls at each step (kinds: listening, connect_failed, conn_lost,
// bad_payload), so that tests sequence on signals rather than sleeps. A hook
// that blocks holds the waiter there.
func NewWaiterWithHook(ctx context.Context, connString string, opts WaiterOptions, hook func(kind, detail string)) (*Waiter, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return newWaiter(ctx, cfg, opts, hook)
}

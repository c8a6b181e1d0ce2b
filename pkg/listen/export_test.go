package listen

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// NewWaiterWithHook is NewWaiter with a hook that the waiter's goroutine
// calls at each step (kinds: listening, connect_failed, conn_lost,
// bad_payload; notified (detail: the key) when a notification arrives,
// before it is dispatched; listen, unlisten (detail: the key) after the
// registration call committed, listen_locked when lease.listen hit
// lock_timeout (retried), listen_all (detail: the key) when a key beyond
// the server's bound on registrations made the waiter register '*',
// listen_failed, unlisten_failed,
// listen_unsupported; read_shared (detail: the key) when an Await joins
// another's read; register_slow when a Watch stopped waiting for its
// registration), so that tests sequence on signals rather than sleeps. A
// hook that blocks holds the waiter there (read_shared and register_slow
// run on the caller's goroutine).
func NewWaiterWithHook(ctx context.Context, cfg *pgx.ConnConfig, opts Options, hook func(kind, detail string)) (*Waiter, error) {
	return newWaiter(ctx, cfg, opts, hook)
}

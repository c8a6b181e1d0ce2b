package listen

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Signal is a step of a Waiter's, reported to the hook of
// NewWaiterWithHook.
type Signal = signal

// The signals (see signal.go for each one's detail).
const (
	Listening         = sigListening
	ConnectFailed     = sigConnectFailed
	ConnLost          = sigConnLost
	BadPayload        = sigBadPayload
	Notified          = sigNotified
	Listen            = sigListen
	Unlisten          = sigUnlisten
	ListenLocked      = sigListenLocked
	ListenAll         = sigListenAll
	ListenFailed      = sigListenFailed
	UnlistenFailed    = sigUnlistenFailed
	ListenUnsupported = sigListenUnsupported
	ReadShared        = sigReadShared
	AcquireShared     = sigAcquireShared
	RegisterSlow      = sigRegisterSlow
)

// NewWaiterWithHook is NewWaiter with a hook that the Waiter calls at each
// step, so that tests sequence on steps rather than sleeps.
func NewWaiterWithHook(ctx context.Context, cfg *pgx.ConnConfig, opts Options, h func(Signal, string)) (*Waiter, error) {
	return newWaiter(ctx, cfg, opts, h)
}

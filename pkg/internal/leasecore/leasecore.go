// Package leasecore lends the packages built beside pkg/lease (handover,
// leaseadmin, leasemetrics, resourcelock) the parts of a lease.Client they
// share with it: the Querier
// it runs on and its error mapping. Package lease sets these when it is
// initialised; nothing else sets them. They exist so that each feature
// area has a package of its own without widening lease's public API.
package leasecore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is lease.Querier.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Set by package lease. client is always a *lease.Client.
var (
	// DB returns the Querier the client runs its calls on.
	DB func(client any) Querier
	// MapError turns a server error into lease's typed errors.
	MapError func(op, key, owner string, err error) error
	// StatusErr is the error for a status other than "ok" (nil for "ok").
	StatusErr func(op, key, owner string, epoch int64, status string) error
	// ServerError wraps a server error with the sentinel kind.
	ServerError func(op string, kind error, pg *pgconn.PgError) error
	// RetryOnce runs call again once after a connection-level failure.
	RetryOnce func(ctx context.Context, call func() error) error
	// CheckTTL refuses a duration the server cannot receive faithfully.
	CheckTTL func(op, key, name string, d time.Duration, allowZero bool) error
	// OnConn runs call on one connection of the client that it watches for
	// commit warnings: a cancelled synchronous wait returns an error
	// matching lease.ErrCommitUnknown, whatever call returned.
	OnConn func(client any, ctx context.Context, op, key string, call func(Querier) error) error
)

// The candidate statements, shared by package handover and lease's
// WarmConn: pgx prepares a statement per text, so both send the same text.
const (
	// RegisterSQL registers a candidate: key, owner, ttl, version, priority, ready.
	RegisterSQL = `SELECT r.status, r.expires_at FROM lease.candidate($1, $2, $3, $4, $5, $6) r`
	// SetStrategySQL sets a key's strategy and returns the one before.
	SetStrategySQL = `SELECT lease.set_strategy($1, $2)`
)

package lease

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/internal/leasecore"
)

// The parts of a Client that the packages beside this one build on.
func init() {
	leasecore.DB = func(client any) leasecore.Querier { return client.(*Client).db }
	leasecore.MapError = func(op, key, owner string, err error) error {
		return mapError(op, Token{Key: key, Owner: owner}, err)
	}
	leasecore.StatusErr = func(op, key, owner string, epoch int64, status string) error {
		return statusErr(op, Token{Key: key, Owner: owner, Epoch: epoch}, status)
	}
	leasecore.ServerError = func(op string, kind error, pg *pgconn.PgError) error {
		return &serverError{op: op, kind: kind, pg: pg}
	}
	leasecore.RetryOnce = retryOnce
	leasecore.OnConn = func(client any, ctx context.Context, op, key string, call func(leasecore.Querier) error) error {
		return client.(*Client).onConn(ctx, op, func() Token { return Token{Key: key} },
			func(q Querier) error { return call(q) })
	}
	leasecore.CheckTTL = func(op, key, name string, d time.Duration, allowZero bool) error {
		return checkTTL(op, Token{Key: key}, name, d, allowZero)
	}
}

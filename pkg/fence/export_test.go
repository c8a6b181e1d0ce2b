package fence

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Claim is PGGuard's conditional write in the caller's transaction (for the
// tests of package fence_test).
func Claim(g *PGGuard, ctx context.Context, tx pgx.Tx, resource string, token lease.Token) error {
	return g.claim(ctx, tx, resource, token)
}

// Epoch is the highest epoch g accepted for resource (0 if none).
func Epoch(g *PGGuard, ctx context.Context, resource string) (int64, error) {
	return g.epoch(ctx, resource)
}

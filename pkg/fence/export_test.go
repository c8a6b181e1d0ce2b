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

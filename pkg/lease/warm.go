package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// WarmConn readies a new connection for this package's calls, so that the
// first acquire, renew, release and inspect it carries cost what later ones
// cost. Set it as the pool's hook:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	cfg.AfterConnect = lease.WarmConn
//
// A backend compiles each PL/pgSQL function, and plans each of its
// statements, on its first call; pgx prepares each statement on its first
// use on a connection. Both are per connection and cost milliseconds
// (docs/benchmarks.md), and they fall exactly on a handoff: a leader's
// only release, a follower's first successful acquire. WarmConn pays them
// when the connection opens: in one transaction it inspects, acquires,
// renews and releases a key of its own (random, under the prefix
// "pg_lease/warm-up/"), then rolls the transaction back, so nothing it did
// is ever committed or notified, and no epoch is used up (a rolled-back
// grant's epoch was never handed out).
//
// It fails only when the connection itself is unusable (its transaction
// cannot begin or roll back); a server without the extension, or a role
// without its privileges, leaves the connection as it was (the calls that
// follow report the cause).
func WarmConn(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("lease: warming the connection: %w", err)
	}
	c := New(tx)
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := "pg_lease/warm-up/" + hex.EncodeToString(b[:])
	// Each step only after the one before succeeded: after an error the
	// transaction accepts nothing more.
	if _, err := c.Inspect(ctx, key); err == nil {
		if g, ok, err := c.Acquire(ctx, key, warmOwner, time.Second); err == nil && ok {
			if _, err := c.Renew(ctx, g.Token, time.Second); err == nil {
				_ = c.Release(ctx, g.Token)
			}
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		return fmt.Errorf("lease: warming the connection: %w", err)
	}
	return nil
}

const warmOwner = "pg_lease/warm-up"

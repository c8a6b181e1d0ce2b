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
// statements, on the first call that runs them; pgx prepares each statement
// on its first use on a connection. Both are per connection and cost
// milliseconds (docs/benchmarks.md), and they fall exactly on a handoff: a
// leader's only release, a follower's first successful acquire. WarmConn
// pays them when the connection opens. In one transaction, on a key of its
// own (random, under the prefix "pg_lease/warm-up/"), it takes every path
// of a handoff: inspect, a first grant, renew, release, a grant of the
// released key, the holder's repeated acquire, and a release that hands
// the key to a registered candidate. It then rolls the transaction back, so
// nothing it did is ever committed or notified, and no epoch is used up (a
// rolled-back grant's epoch was never handed out).
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
	var b [8]byte
	_, _ = rand.Read(b[:])
	_ = warm(ctx, New(tx), "pg_lease/warm-up/"+hex.EncodeToString(b[:]))
	if err := tx.Rollback(ctx); err != nil {
		return fmt.Errorf("lease: warming the connection: %w", err)
	}
	return nil
}

// warm runs the calls of WarmConn on key and returns the first error; after
// an error the transaction accepts nothing more.
func warm(ctx context.Context, c *Client, key string) error {
	const ttl = time.Second
	if _, err := c.Inspect(ctx, key); err != nil {
		return err
	}
	// A first grant, its renewal and its release.
	g, _, err := c.Acquire(ctx, key, warmOwner, ttl)
	if err != nil {
		return err
	}
	if _, err := c.Renew(ctx, g.Token, ttl); err != nil {
		return err
	}
	if err := c.Release(ctx, g.Token); err != nil {
		return err
	}
	// A grant of a released key (a follower's acquire in a handoff), then
	// the holder's own acquire again (what a candidate handed the key runs).
	if g, _, err = c.Acquire(ctx, key, warmOwner, ttl); err != nil {
		return err
	}
	if _, _, err := c.Acquire(ctx, key, warmOwner, ttl); err != nil {
		return err
	}
	// A release that hands the key to a registered candidate, through the
	// statements package handover sends.
	var prev string
	if err := c.db.QueryRow(ctx, setStrategySQL, key, "newest_version").Scan(&prev); err != nil {
		return mapError("set strategy", Token{Key: key}, err)
	}
	var (
		status    string
		expiresAt *time.Time
		version   = "1.0.0"
	)
	if err := c.db.QueryRow(ctx, registerSQL, key, warmCandidate, ttl, &version, int32(0), true).
		Scan(&status, &expiresAt); err != nil {
		return mapError("register", Token{Key: key, Owner: warmCandidate}, err)
	}
	if err := statusErr("register", Token{Key: key, Owner: warmCandidate}, status); err != nil {
		return err
	}
	return c.Release(ctx, g.Token)
}

const (
	warmOwner     = "pg_lease/warm-up"
	warmCandidate = "pg_lease/warm-up/candidate"
)

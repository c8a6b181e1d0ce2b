package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLeasePoolWarmsConnections: a connection of the lease pool has run
// the paths of a rebalance (a release that hands a key over, a grant)
// before the Sharder gets it, so a leave's first release does not plan
// them.
func TestLeasePoolWarmsConnections(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 0)
	cfg, err := leasePoolConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var log pgtest.Statements
	log.Traced(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn.Release()
	for _, fn := range []string{"lease.acquire", "lease.candidate", "lease.release"} {
		if len(log.Calling(fn)) == 0 {
			t.Errorf("the new connection did not run %s before its first use", fn)
		}
	}
}

// TestLeasePoolKeepsWarmConnectionsIdle: with one connection in use (a
// round's statement), the pool opens and warms others in the background,
// so a handover's acquire does not open one on its way.
func TestLeasePoolKeepsWarmConnectionsIdle(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 0)
	cfg, err := leasePoolConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	busy, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	deadline := time.Now().Add(time.Minute)
	for pool.Stat().IdleConns() < leaseIdleConns {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections beside one in use after a minute, want %d", pool.Stat().IdleConns(), leaseIdleConns)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeasePoolOpensItsConnectionsBeforeUse: the pool opens and warms
// leaseConns connections when it starts; once they are open, that many
// statements at once (a round, a renewal, a handover's take, a release)
// each find one ready: no connection is opened on the way of any of them.
func TestLeasePoolOpensItsConnectionsBeforeUse(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 0)
	cfg, err := leasePoolConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	opened := 0
	warm := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		mu.Lock()
		opened++
		mu.Unlock()
		return warm(ctx, c)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(time.Minute)
	for pool.Stat().IdleConns() < leaseConns {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections a minute after the start, want %d", pool.Stat().IdleConns(), leaseConns)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	before := opened
	mu.Unlock()
	var conns []*pgxpool.Conn
	for range leaseConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	mu.Lock()
	after := opened
	mu.Unlock()
	for _, c := range conns {
		c.Release()
	}
	if after != before {
		t.Errorf("%d statements at once opened %d connections on their way, want none", leaseConns, after-before)
	}
}

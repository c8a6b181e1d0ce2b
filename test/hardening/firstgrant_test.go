package hardening

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// TestFreeKeysAlwaysGranted: 8 sessions acquire 24,000 distinct keys that
// were never leased, with wait 0, all at once. Every one is granted: a first
// grant's insertion waits for the server's own short locks (extending the
// table and its index) instead of being denied by them.
func TestFreeKeysAlwaysGranted(t *testing.T) {
	const sessions, perSession = 8, 3000
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 10*time.Minute)
	pool := pgtest.NewPool(t, dsn, pgtest.MaxConns(sessions))
	var denied, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for s := 0; s < sessions; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			defer conn.Release()
			<-start
			for i := 0; i < perSession; i++ {
				var ok bool
				key := fmt.Sprintf("fg-%d-%d", s, i)
				if err := conn.QueryRow(ctx, `SELECT acquired FROM lease.acquire($1, 'o', '10 min')`, key).Scan(&ok); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if !ok {
					denied.Add(1)
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Fatalf("%d sessions failed: %v", failed.Load(), err)
	}
	if d := denied.Load(); d > 0 {
		t.Fatalf("%d of %d never-leased keys denied (wait 0)", d, sessions*perSession)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM lease.leases WHERE key LIKE 'fg-%' AND epoch = 1 AND owner = 'o'`).Scan(&rows); err != nil || rows != sessions*perSession {
		t.Fatalf("%d granted rows (%v), want %d", rows, err, sessions*perSession)
	}
	t.Logf("%d first grants from %d sessions in %v, none denied", rows, sessions, time.Since(t0).Round(time.Millisecond))
}

// TestOneKeyManySessions: 16 sessions acquire one never-leased key at once
// with wait 0, many rounds: exactly one is granted each round, every other
// is denied cleanly (acquired = false, no error).
func TestOneKeyManySessions(t *testing.T) {
	const sessions, rounds = 16, 50
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 10*time.Minute)
	pool := pgtest.NewPool(t, dsn, pgtest.MaxConns(sessions))
	for r := 0; r < rounds; r++ {
		key := fmt.Sprintf("one-%d", r)
		var granted, denied atomic.Int64
		var firstErr atomic.Value
		var wg sync.WaitGroup
		start := make(chan struct{})
		for s := 0; s < sessions; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := pool.Acquire(ctx)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				defer conn.Release()
				<-start
				var ok bool
				if err := conn.QueryRow(ctx, `SELECT acquired FROM lease.acquire($1, $2, '10 min')`, key, fmt.Sprint("o", s)).Scan(&ok); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if ok {
					granted.Add(1)
				} else {
					denied.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if err, _ := firstErr.Load().(error); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		if granted.Load() != 1 || denied.Load() != sessions-1 {
			t.Fatalf("round %d: %d granted, %d denied; want 1 and %d", r, granted.Load(), denied.Load(), sessions-1)
		}
		var epoch int64
		if err := pool.QueryRow(ctx, `SELECT epoch FROM lease.leases WHERE key = $1`, key).Scan(&epoch); err != nil || epoch != 1 {
			t.Fatalf("round %d: epoch %d (%v), want 1", r, epoch, err)
		}
	}
}

// Package cleanup tests lease.cleanup (pg_lease 0.2.0) against the fencing
// invariants: a key's epochs never regress across its clean-up (I2, I3), a
// held key is never removed, concurrent clean-ups and acquires keep both, and
// invalid input is refused with SQLSTATE 22023.
//
// The tests install pg_lease with CREATE EXTENSION and then update it to
// 0.2.0 when the default version is older, so they pass whether the
// extension's default_version is 0.1.0 or 0.2.0.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newDB returns a pool on a fresh database with pg_lease at 0.2.0 or later
// (NewLeaseDatabase creates the default version; an older one is updated).
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := pgtest.Context(t, 0)
	pool := pgtest.NewLeasePool(t, pgtest.MaxConns(16))
	var has bool
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure('lease.cleanup(interval,integer)') IS NOT NULL`).Scan(&has); err != nil {
		t.Fatal(err)
	}
	if !has {
		if _, err := pool.Exec(ctx, `ALTER EXTENSION pg_lease UPDATE TO '0.2.0'`); err != nil {
			t.Fatal(err)
		}
	}
	return pool
}

type cleanupResult struct{ removed, floor int64 }

func cleanup(ctx context.Context, q lease.Querier, freeFor string, maxRows int) (cleanupResult, error) {
	var r cleanupResult
	err := q.QueryRow(ctx, `SELECT removed, epoch_floor FROM lease.cleanup($1::interval, $2)`, freeFor, maxRows).Scan(&r.removed, &r.floor)
	return r, err
}

func mustCleanup(t *testing.T, q lease.Querier, freeFor string, maxRows int) cleanupResult {
	t.Helper()
	r, err := cleanup(pgtest.Context(t, 0), q, freeFor, maxRows)
	if err != nil {
		t.Fatalf("lease.cleanup(%s, %d): %v", freeFor, maxRows, err)
	}
	return r
}

// rowEpoch is the key's epoch counter, or 0 when the key has no row.
func rowEpoch(t *testing.T, q lease.Querier, key string) int64 {
	t.Helper()
	var e int64
	err := q.QueryRow(pgtest.Context(t, 0), `SELECT coalesce((SELECT epoch FROM lease.inspect($1)), 0)`, key).Scan(&e)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustAcquire(t *testing.T, c *lease.Client, key, owner string, ttl time.Duration) lease.Grant {
	t.Helper()
	g, ok, err := c.Acquire(pgtest.Context(t, 0), key, owner, ttl)
	if err != nil || !ok {
		t.Fatalf("acquire %s for %s: ok=%v err=%v", key, owner, ok, err)
	}
	return g
}

// TestReacquiredAfterCleanupEpochAboveEvery: a key removed by clean-up and
// acquired again gets an epoch above every epoch it had, whether it was
// released or lapsed, and across repeated clean-ups; the floor is the highest
// epoch counter removed, even one of another key.
func TestReacquiredAfterCleanupEpochAboveEvery(t *testing.T) {
	pool := newDB(t)
	c := lease.New(pool)
	ctx := pgtest.Context(t, 0)

	highest := map[string]int64{} // every epoch each key ever had (grants and counters)
	note := func(key string, e int64) {
		if e > highest[key] {
			highest[key] = e
		}
	}
	// k-released: several grants and releases. k-other: a higher counter.
	for i := 0; i < 5; i++ {
		g := mustAcquire(t, c, "k-released", "a", time.Minute)
		note("k-released", g.Epoch)
		if err := c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		note("k-released", rowEpoch(t, pool, "k-released"))
	}
	for i := 0; i < 9; i++ {
		g := mustAcquire(t, c, "k-other", "b", time.Minute)
		if err := c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
	}
	note("k-other", rowEpoch(t, pool, "k-other"))
	// k-lapsed: a grant that lapses without release.
	g := mustAcquire(t, c, "k-lapsed", "a", 20*time.Millisecond)
	note("k-lapsed", g.Epoch)
	time.Sleep(50 * time.Millisecond)

	// Keys free for less than free_for stay.
	if r := mustCleanup(t, pool, "1 hour", 1000); r.removed != 0 {
		t.Fatalf("cleanup('1 hour') removed %d keys that were free for less than an hour", r.removed)
	}
	r := mustCleanup(t, pool, "0 s", 1000)
	if r.removed != 3 {
		t.Fatalf("cleanup removed %d keys, want 3", r.removed)
	}
	if r.floor < highest["k-other"] {
		t.Fatalf("epoch floor %d below the highest removed counter %d", r.floor, highest["k-other"])
	}
	for _, k := range []string{"k-released", "k-other", "k-lapsed"} {
		if e := rowEpoch(t, pool, k); e != 0 {
			t.Fatalf("%s still has a row (epoch %d) after cleanup", k, e)
		}
	}

	for round := 0; round < 3; round++ {
		for _, k := range []string{"k-released", "k-other", "k-lapsed"} {
			g := mustAcquire(t, c, k, fmt.Sprintf("new-%d", round), time.Minute)
			if g.Epoch <= highest[k] {
				t.Fatalf("round %d: %s re-acquired after cleanup with epoch %d, not above its highest epoch %d", round, k, g.Epoch, highest[k])
			}
			note(k, g.Epoch)
			if err := c.Release(ctx, g.Token); err != nil {
				t.Fatal(err)
			}
			note(k, rowEpoch(t, pool, k))
		}
		if r := mustCleanup(t, pool, "0 s", 1000); r.removed != 3 {
			t.Fatalf("round %d: cleanup removed %d keys, want 3", round, r.removed)
		}
	}
}

// TestCleanupNeverRemovesHeldKey: held keys survive any clean-up, with their
// grant unchanged; so does a key that an uncommitted acquire is taking over;
// max_rows bounds the removals.
func TestCleanupNeverRemovesHeldKey(t *testing.T) {
	pool := newDB(t)
	c := lease.New(pool)
	ctx := pgtest.Context(t, 0)

	held := map[string]lease.Grant{}
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("held-%d", i)
		held[k] = mustAcquire(t, c, k, "holder", time.Hour)
		f := fmt.Sprintf("free-%d", i)
		g := mustAcquire(t, c, f, "x", time.Hour)
		if err := c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
	}
	if r := mustCleanup(t, pool, "0 s", 10); r.removed != 10 {
		t.Fatalf("cleanup(max_rows 10) removed %d", r.removed)
	}
	if r := mustCleanup(t, pool, "0 s", 1000); r.removed != 40 {
		t.Fatalf("cleanup removed %d, want the 40 remaining free keys", r.removed)
	}
	if r := mustCleanup(t, pool, "0 s", 1000); r.removed != 0 {
		t.Fatalf("a third cleanup removed %d, want 0", r.removed)
	}
	for k, g := range held {
		st, err := c.Inspect(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held || st.Owner != "holder" || st.Epoch != g.Epoch {
			t.Fatalf("held key %s after cleanup: %+v, want held by holder at epoch %d", k, st, g.Epoch)
		}
		if _, err := c.Renew(ctx, g.Token, time.Hour); err != nil {
			t.Fatalf("renew of held key %s after cleanup: %v", k, err)
		}
	}

	// A free key being taken over by a transaction that has not committed:
	// the clean-up skips the locked row, and the grant stands after commit.
	g := mustAcquire(t, c, "racing", "x", time.Hour)
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tg, ok, err := lease.New(tx).Acquire(ctx, "racing", "y", time.Hour)
	if err != nil || !ok {
		t.Fatalf("acquire in tx: ok=%v err=%v", ok, err)
	}
	if r := mustCleanup(t, pool, "0 s", 1000); r.removed != 0 {
		t.Fatalf("cleanup removed %d rows while a takeover of 'racing' was uncommitted", r.removed)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := c.Inspect(ctx, "racing")
	if err != nil || !st.Held || st.Epoch != tg.Epoch || st.Owner != "y" {
		t.Fatalf("racing after commit: %+v %v, want held by y at epoch %d", st, err, tg.Epoch)
	}
}

type grantRec struct {
	start, end time.Time
	epoch      int64
	owner      string
}

// TestConcurrentCleanupAndAcquire: goroutines acquire, check, renew and
// release a few shared keys while others clean up continuously. No grant may
// carry an epoch at or below one granted (or counted) before it was asked
// for, no two grants of a key share an epoch, and no held key disappears
// (its renewal keeps succeeding until its release).
func TestConcurrentCleanupAndAcquire(t *testing.T) {
	pool := newDB(t)
	c := lease.New(pool)
	ctx := pgtest.Context(t, 0)

	const (
		workers  = 10
		cleaners = 3
		keys     = 6
		iters    = 150
	)
	var mu sync.Mutex
	grants := map[string][]grantRec{}
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}

	done := make(chan struct{})
	var cwg sync.WaitGroup
	var cleaned, cleanCalls int64
	var cmu sync.Mutex
	for i := 0; i < cleaners; i++ {
		cwg.Add(1)
		go func(i int) {
			defer cwg.Done()
			var lastFloor int64
			for n := 0; n < 100000; n++ {
				select {
				case <-done:
					return
				default:
				}
				r, err := cleanup(ctx, pool, "0 s", 1+rand.IntN(3))
				if err != nil {
					fail("cleaner %d: %v", i, err)
					return
				}
				if r.floor < lastFloor {
					fail("cleaner %d: epoch floor went down from %d to %d", i, lastFloor, r.floor)
				}
				lastFloor = r.floor
				cmu.Lock()
				cleaned += r.removed
				cleanCalls++
				cmu.Unlock()
			}
		}(i)
	}

	var wwg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wwg.Add(1)
		go func(w int) {
			defer wwg.Done()
			owner := fmt.Sprintf("w%d", w)
			for i := 0; i < iters; i++ {
				key := fmt.Sprintf("k%d", rand.IntN(keys))
				start := time.Now()
				g, ok, err := c.Acquire(ctx, key, owner, time.Minute)
				end := time.Now()
				if err != nil {
					fail("%s acquire %s: %v", owner, key, err)
					return
				}
				if !ok {
					continue
				}
				mu.Lock()
				grants[key] = append(grants[key], grantRec{start: start, end: end, epoch: g.Epoch, owner: owner})
				mu.Unlock()
				// Held: clean-ups run meanwhile; the grant must survive.
				for j := 0; j < 2; j++ {
					if _, err := c.Renew(ctx, g.Token, time.Minute); err != nil {
						fail("%s renew of held %v: %v (removed by cleanup?)", owner, g.Token, err)
						return
					}
				}
				if err := c.Release(ctx, g.Token); err != nil {
					fail("%s release of held %v: %v", owner, g.Token, err)
					return
				}
			}
		}(w)
	}
	wwg.Wait()
	close(done)
	cwg.Wait()
	for _, f := range failures {
		t.Error(f)
	}

	total := 0
	for key, gs := range grants {
		total += len(gs)
		seen := map[int64]string{}
		for _, g := range gs {
			if o, dup := seen[g.epoch]; dup {
				t.Errorf("%s: epoch %d granted twice (%s and %s)", key, g.epoch, o, g.owner)
			}
			seen[g.epoch] = g.owner
		}
		sort.Slice(gs, func(i, j int) bool { return gs[i].end.Before(gs[j].end) })
		for i, a := range gs {
			for _, b := range gs[i+1:] {
				if a.end.Before(b.start) && b.epoch <= a.epoch {
					t.Errorf("%s: epoch regressed: grant %d (returned %v) then grant %d asked for later", key, a.epoch, a.end, b.epoch)
				}
			}
		}
	}
	t.Logf("%d grants on %d keys; %d rows removed in %d clean-ups", total, keys, cleaned, cleanCalls)
	if total == 0 || cleaned == 0 {
		t.Errorf("the test exercised nothing: %d grants, %d rows cleaned", total, cleaned)
	}
	// After everything: every key's counter is at least its highest grant.
	for key, gs := range grants {
		maxE := int64(0)
		for _, g := range gs {
			maxE = max(maxE, g.epoch)
		}
		g := mustAcquire(t, c, key, "final", time.Minute)
		if g.Epoch <= maxE {
			t.Errorf("%s: final grant epoch %d not above the highest earlier grant %d", key, g.Epoch, maxE)
		}
	}
}

// TestCleanupInvalidInput: every invalid argument is refused with
// invalid_input (22023), naming each violation, and nothing is removed.
func TestCleanupInvalidInput(t *testing.T) {
	pool := newDB(t)
	c := lease.New(pool)
	ctx := pgtest.Context(t, 0)
	g := mustAcquire(t, c, "free", "x", time.Hour)
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		freeFor any
		maxRows any
		want    []string
	}{
		{nil, 10, []string{"free_for must not be NULL"}},
		{"-1 s", 10, []string{"free_for must not be negative"}},
		{"0 s", nil, []string{"max_rows must not be NULL"}},
		{"0 s", 0, []string{"max_rows must be at least 1"}},
		{"1 s", -5, []string{"max_rows must be at least 1"}},
		{"-1 day", 0, []string{"free_for must not be negative", "max_rows must be at least 1"}},
		{"300000 years", 10, []string{"free_for is too large"}},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%v/%v", tc.freeFor, tc.maxRows)
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			var removed int64
			err := pool.QueryRow(ctx, `SELECT removed FROM lease.cleanup($1::interval, $2::integer)`, tc.freeFor, tc.maxRows).Scan(&removed)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
				t.Fatalf("err = %v, want SQLSTATE 22023", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(pgErr.Detail, w) {
					t.Errorf("DETAIL %q does not name %q", pgErr.Detail, w)
				}
			}
		})
	}
	if e := rowEpoch(t, pool, "free"); e == 0 {
		t.Fatal("an invalid cleanup call removed a key")
	}
	// The default max_rows is accepted.
	var removed int64
	if err := pool.QueryRow(ctx, `SELECT removed FROM lease.cleanup(interval '0 s')`).Scan(&removed); err != nil || removed != 1 {
		t.Fatalf("cleanup with the default max_rows: removed %d, err %v", removed, err)
	}
}

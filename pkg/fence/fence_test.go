package fence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func testCtx(t *testing.T) context.Context { return pgtest.Context(t, time.Minute) }

// newPool is a pool on a fresh database, with pg_lease created or not.
func newPool(t *testing.T, withLease bool) *pgxpool.Pool {
	if withLease {
		return pgtest.NewLeasePool(t)
	}
	return pgtest.NewPool(t, pgtest.NewDatabase(t))
}

func acquire(t *testing.T, c *lease.Client, key, owner string, ttl time.Duration) lease.Grant {
	t.Helper()
	g, ok, err := c.Acquire(testCtx(t), key, owner, ttl)
	if err != nil || !ok {
		t.Fatalf("acquire %s by %s: ok=%v err=%v", key, owner, ok, err)
	}
	return g
}

// TestInTx: writes commit under the current grant; a stale token is
// rejected before the caller's function runs; a takeover waits for a
// fenced transaction in progress and the stale writer's commit comes first.
func TestInTx(t *testing.T) {
	pool := newPool(t, true)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE w (epoch bigint)"); err != nil {
		t.Fatal(err)
	}
	c := lease.New(pool)
	insert := func(epoch int64) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO w VALUES ($1)", epoch)
			return err
		}
	}
	// A short grant, written under and fenced by an open transaction
	// before it lapses. When the grant lapsed before the fence was taken
	// (the server says so), the steps are redone with a grant twice as long.
	var (
		g1 lease.Grant
		tx pgx.Tx
	)
	for ttl := 300 * time.Millisecond; ; ttl *= 2 {
		g1 = acquire(t, c, "k", "a", ttl)
		err := fence.InTx(ctx, pool, g1.Token, insert(g1.Epoch))
		if err == nil {
			// A fenced transaction in progress holds off the takeover.
			if tx, err = pool.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // never leave the pool waiting on it
			if _, err = lease.Fence(ctx, tx, g1.Token); err == nil {
				break
			}
			_ = tx.Rollback(ctx)
		}
		if !errors.Is(err, lease.ErrLapsed) {
			t.Fatal(err)
		}
		t.Logf("the grant of %v lapsed before it was fenced; again with a longer one", ttl)
		if _, err := pool.Exec(ctx, "DELETE FROM w"); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitServerPast(t, pool, g1.ExpiresAt) // the grant expires while fenced
	// A non-blocking acquire never waits for the fenced row (0.3.0): denied.
	if _, ok, err := c.Acquire(ctx, "k", "b", time.Minute); err != nil || ok {
		t.Fatalf("non-blocking takeover of a fenced key: ok=%v err=%v (want denied at once)", ok, err)
	}
	// A blocking one waits for the fenced transaction to end.
	took := make(chan lease.Grant, 1)
	go func() {
		g, err := c.AcquireWait(ctx, "k", "b", time.Minute, 20*time.Second)
		if err != nil {
			t.Errorf("takeover: %v", err)
		}
		took <- g
	}()
	select {
	case <-took:
		t.Fatal("takeover committed while a fenced transaction was open")
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := tx.Exec(ctx, "INSERT INTO w VALUES ($1)", g1.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	g2 := <-took
	if g2.Epoch <= g1.Epoch {
		t.Fatalf("takeover epoch %d", g2.Epoch)
	}

	// The stale token is now rejected; fn is not called.
	called := false
	err := fence.InTx(ctx, pool, g1.Token, func(pgx.Tx) error { called = true; return nil })
	if !errors.Is(err, fence.ErrStale) || !errors.Is(err, lease.ErrLost) || !errors.Is(err, lease.ErrLapsed) || called {
		t.Errorf("stale InTx: err=%v called=%v", err, called)
	}
	if err := fence.InTx(ctx, pool, g2.Token, insert(g2.Epoch)); err != nil {
		t.Fatal(err)
	}
	// An error from fn rolls back.
	boom := errors.New("boom")
	if err := fence.InTx(ctx, pool, g2.Token, func(tx pgx.Tx) error {
		_ = insert(99)(tx)
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("fn error: %v", err)
	}
	var n, high int64
	if err := pool.QueryRow(ctx, "SELECT count(*), max(epoch) FROM w").Scan(&n, &high); err != nil {
		t.Fatal(err)
	}
	if n != 3 || high != g2.Epoch {
		t.Errorf("rows %d, max epoch %d", n, high)
	}
}

// TestPGGuard: the fence_epochs table rejects a lower epoch once a higher
// one was accepted, equal epochs pass, concurrent writers serialize.
func TestPGGuard(t *testing.T) {
	pool := newPool(t, false) // any PostgreSQL database: no pg_lease needed
	ctx := testCtx(t)
	g, err := fence.NewPGGuard(pool, fence.PGGuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureTable(ctx); err != nil {
		t.Fatalf("EnsureTable twice: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE data (v text, epoch bigint)"); err != nil {
		t.Fatal(err)
	}
	write := func(epoch int64, v string) error {
		return g.Write(ctx, lease.Token{Key: "job", Owner: v, Epoch: epoch}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO data VALUES ($1, $2)", v, epoch)
			return err
		})
	}
	for _, step := range []struct {
		epoch int64
		stale bool
	}{{3, false}, {3, false}, {2, true}, {5, false}, {4, true}, {1, true}, {5, false}} {
		err := write(step.epoch, "x")
		var se *fence.StaleError
		if step.stale != errors.Is(err, fence.ErrStale) || (step.stale && (!errors.As(err, &se) || se.Highest != 5 && se.Highest != 3)) {
			t.Errorf("write with epoch %d: %v (want stale=%v)", step.epoch, err, step.stale)
		}
		if !step.stale && err != nil {
			t.Errorf("write with epoch %d: %v", step.epoch, err)
		}
	}
	if e, err := fence.Epoch(g, ctx, "job"); err != nil || e != 5 {
		t.Errorf("Epoch = %d, %v", e, err)
	}
	if e, err := fence.Epoch(g, ctx, "other"); err != nil || e != 0 {
		t.Errorf("Epoch(other) = %d, %v", e, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM data").Scan(&rows); err != nil || rows != 4 {
		t.Errorf("rows written %d, %v; want 4 (the accepted writes)", rows, err)
	}

	// A writer holding the claim blocks a higher epoch until it commits,
	// and a lower epoch is rejected even though it started first.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.Claim(g, ctx, tx, "job", lease.Token{Epoch: 6}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	higher := make(chan error, 1)
	go func() { defer wg.Done(); higher <- write(7, "y") }()
	select {
	case err := <-higher:
		t.Fatalf("epoch 7 committed while epoch 6 held the claim: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-higher; err != nil {
		t.Errorf("epoch 7 after 6: %v", err)
	}
	if err := write(6, "z"); !errors.Is(err, fence.ErrStale) {
		t.Errorf("epoch 6 after 7: %v", err)
	}
}

// TestPGGuardOwnRows: the epoch lives on the caller's own rows.
func TestPGGuardOwnRows(t *testing.T) {
	pool := newPool(t, false)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id text PRIMARY KEY, state text, fence_epoch bigint);
		INSERT INTO jobs VALUES ('j1', 'new', NULL)`); err != nil {
		t.Fatal(err)
	}
	g, err := fence.NewPGGuard(pool, fence.PGGuardOptions{Table: "public.jobs", ResourceColumn: "id", EpochColumn: "fence_epoch", OwnRows: true})
	if err != nil {
		t.Fatal(err)
	}
	set := func(epoch int64, state string) error {
		return g.WriteResource(ctx, "j1", lease.Token{Key: "jobs", Epoch: epoch}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE jobs SET state = $1 WHERE id = 'j1'", state)
			return err
		})
	}
	if err := set(2, "running"); err != nil {
		t.Fatal(err)
	}
	if err := set(1, "stale"); !errors.Is(err, fence.ErrStale) {
		t.Errorf("lower epoch: %v", err)
	}
	if err := g.WriteResource(ctx, "missing", lease.Token{Epoch: 3}, nil); !errors.Is(err, fence.ErrNoResource) {
		t.Errorf("missing row: %v", err)
	}
	var state string
	if err := pool.QueryRow(ctx, "SELECT state FROM jobs WHERE id = 'j1'").Scan(&state); err != nil || state != "running" {
		t.Errorf("state %q, %v", state, err)
	}
	if err := g.EnsureTable(ctx); err == nil {
		t.Error("EnsureTable on OwnRows succeeded")
	}
}

func TestPGGuardOptionsValidation(t *testing.T) {
	for _, o := range []fence.PGGuardOptions{
		{Table: "a;drop"}, {Table: "a.b.c"}, {ResourceColumn: "x y"}, {EpochColumn: `"e`},
		{Table: `""`}, {Table: "a..b"}, {Table: "a."}, {Table: ".a"}, {Table: `"a"b`}, {Table: `"a"."b".c`},
		{Table: "1abc"}, {Table: "$a"}, {Table: "jöbs"}, {Table: `"a` + "\x00" + `"`},
		{ResourceColumn: "t.c"}, {EpochColumn: `"t"."c"`},
		{Table: strings.Repeat("a", 64)}, {Table: `"` + strings.Repeat("A", 64) + `"`},
	} {
		if _, err := fence.NewPGGuard(&pgxpool.Pool{}, o); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("NewPGGuard(%+v): %v, want an error matching lease.ErrInvalidInput", o, err)
		}
	}
}

// TestCommitUnknown: on a pool opened with lease.ObserveCommits, a fenced
// write whose commit's wait for the synchronous standbys was cancelled
// returns lease.ErrCommitUnknown (InTx and PGGuard), not success: PostgreSQL
// reports such a commit as done, with a warning, though a failover may lose
// it. The server names a synchronous standby that never connects.
func TestCommitUnknown(t *testing.T) {
	srv := pgtest.New(t)
	dsn := pgtest.NewLeaseDatabaseOn(t, srv)
	ctx := testCtx(t) // after the server's start, which has its own bound
	pool := pgtest.NewPool(t, dsn, func(c *pgxpool.Config) { lease.ObserveCommits(&c.ConnConfig.Config) })
	if _, err := pool.Exec(ctx, "CREATE TABLE w (epoch bigint)"); err != nil {
		t.Fatal(err)
	}
	guard, err := fence.NewPGGuard(pool, fence.PGGuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	g := acquire(t, lease.New(pool), "k", "a", time.Minute)
	var dbname string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	cancelled := pgtest.CancelSyncWaits(t, srv, dbname)

	insert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO w VALUES ($1)", g.Epoch)
		return err
	}
	if err := fence.InTx(ctx, pool, g.Token, insert); !errors.Is(err, lease.ErrCommitUnknown) {
		t.Fatalf("InTx with its commit's synchronous wait cancelled: %v, want ErrCommitUnknown", err)
	}
	if err := guard.Write(ctx, g.Token, insert); !errors.Is(err, lease.ErrCommitUnknown) {
		t.Fatalf("PGGuard.Write with its commit's synchronous wait cancelled: %v, want ErrCommitUnknown", err)
	}
	// Both commits happened on this server (the outcome is unknown, not failed).
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM w").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows committed locally: %d (%v), want 2", n, err)
	}
	pgtest.Eventually(t, time.Minute, "two synchronous waits counted as cancelled", func() bool { return cancelled.Load() >= 2 })
}

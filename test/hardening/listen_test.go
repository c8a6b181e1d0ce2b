package hardening

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglease/pg_lease/internal/pgtest"
)

// TestListenCleanupKeepsLiveRegistration: a listen in a transaction whose
// view of pg_stat_activity was taken before a waiter connected drops no
// registration of that waiter (the clean-up reads the live backends fresh),
// and the waiter's release notification arrives.
func TestListenCleanupKeepsLiveRegistration(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	old := pgtest.Connect(t, dsn)
	defer old.Close(ctx)
	holder := pgtest.Connect(t, dsn)
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, `SELECT lease.acquire('lc', 'h', '1 min')`); err != nil {
		t.Fatal(err)
	}

	// The old transaction reads pg_stat_activity first: its cached view
	// has no waiter yet.
	tx, err := old.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var backends int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity`).Scan(&backends); err != nil {
		t.Fatal(err)
	}

	waiter := registeredWaiter(t, ctx, dsn, "lc")
	defer waiter.Close(ctx)
	var waiterPID uint32 = waiter.PgConn().PID()
	var cached int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, waiterPID).Scan(&cached); err != nil {
		t.Fatal(err)
	}
	if cached != 0 {
		t.Fatalf("the old transaction already sees the waiter (%d): the test cannot show the stale view", cached)
	}

	// The old transaction's listen runs the clean-up.
	if _, err := tx.Exec(ctx, `SELECT lease.listen('lc-other')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := holder.QueryRow(ctx, `SELECT count(*) FROM lease.listeners WHERE pid = $1 AND key = 'lc'`, waiterPID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the live waiter's registration was dropped by a clean-up that used a stale view (%d left)", n)
	}
	if _, err := holder.Exec(ctx, `SELECT lease.release('lc', 'h', 1)`); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	note, err := waiter.WaitForNotification(nctx)
	if err != nil {
		t.Fatalf("no notification of the release: %v", err)
	}
	t.Logf("notified: %s", note.Payload)
}

// TestListenCleanupBounded: registrations of many backends that are gone
// (thousands of rows) are dropped a bounded number per call, and no call
// scans them all.
func TestListenCleanupBounded(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	c := pgtest.Connect(t, dsn)
	defer c.Close(ctx)
	// 8,000 registrations of 1,000-byte keys by 8 backends that are gone
	// (pids that no backend has: negative).
	if _, err := c.Exec(ctx, `INSERT INTO lease.listeners
		SELECT -(i % 8) - 1, repeat('k', 990) || i, clock_timestamp() FROM generate_series(1, 8000) i`); err != nil {
		t.Fatal(err)
	}
	left := func() (n int) {
		if err := c.QueryRow(ctx, `SELECT count(*) FROM lease.listeners WHERE pid < 0`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := 0; i < 3; i++ {
		before := left()
		if _, err := c.Exec(ctx, `SELECT lease.listen('lb-'||$1::text)`, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if dropped := before - left(); dropped < 1 || dropped > 100 {
			t.Fatalf("one listen dropped %d registrations of gone backends, want 1 to 100", dropped)
		}
	}
	// The blocks a call reads: the distinct pids through the index and the
	// rows it drops, not every registration.
	var pages int64
	if err := c.QueryRow(ctx, `SELECT pg_relation_size('lease.listeners') / 8192`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	// The buffers one call touches, in every relation (EXPLAIN counts the
	// statements inside the function too).
	var out []byte
	if err := c.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT lease.listen('lb-y')`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("EXPLAIN output %s: %v", out, err)
	}
	hit0, hit1 := int64(0), plan[0].Plan.Hit+plan[0].Plan.Read
	t.Logf("listeners: %d pages; one listen touched %d buffers", pages, hit1-hit0)
	// A scan of the registrations alone touches every page (0.3.0 did,
	// and deleted all 8,000 in one call).
	if hit1-hit0 >= pages {
		t.Errorf("one listen touched %d buffers, the registrations fill %d pages: it scans them", hit1-hit0, pages)
	}
}

// TestRepeatableReadChangeNotifiesLateRegistration: a release in a
// REPEATABLE READ transaction whose snapshot predates a waiter's
// registration still notifies that waiter (the registration is not in the
// snapshot, so such a change notifies whatever it reads).
func TestRepeatableReadChangeNotifiesLateRegistration(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	holder := pgtest.Connect(t, dsn)
	defer holder.Close(ctx)
	var epoch int64
	if err := holder.QueryRow(ctx, `SELECT epoch FROM lease.acquire('rr', 'h', '1 min')`).Scan(&epoch); err != nil {
		t.Fatal(err)
	}

	// The holder's transaction takes its snapshot before the waiter registers.
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var listeners int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM lease.listeners`).Scan(&listeners); err != nil {
		t.Fatal(err)
	}

	waiter := registeredWaiter(t, ctx, dsn, "rr")
	defer waiter.Close(ctx)
	var seen int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM lease.listeners WHERE key = 'rr'`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	if seen != 0 {
		t.Fatalf("the holder's snapshot already has the registration (%d): the test cannot show the late one", seen)
	}

	if _, err := tx.Exec(ctx, `SELECT lease.release('rr', 'h', $1)`, epoch); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	note, err := waiter.WaitForNotification(nctx)
	if err != nil {
		t.Fatalf("no notification of a release whose snapshot predates the registration: %v", err)
	}
	var got struct {
		Event string `json:"event"`
		Key   string `json:"key"`
	}
	if err := json.Unmarshal([]byte(note.Payload), &got); err != nil {
		t.Fatal(err)
	}
	if got.Event != "released" || got.Key != "rr" {
		t.Fatalf("notified %s, want the release of rr", note.Payload)
	}
}

// registeredWaiter connects a waiter that listens on pg_lease and whose
// registration for key is committed (lease.listen answered true).
func registeredWaiter(t *testing.T, ctx context.Context, dsn, key string) *pgx.Conn {
	t.Helper()
	waiter := pgtest.Connect(t, dsn)
	if _, err := waiter.Exec(ctx, `LISTEN pg_lease`); err != nil {
		t.Fatal(err)
	}
	var settled bool
	for i := 0; i < 2 && !settled; i++ {
		if err := waiter.QueryRow(ctx, `SELECT lease.listen($1)`, key).Scan(&settled); err != nil {
			t.Fatal(err)
		}
	}
	if !settled {
		t.Fatal("the second listen, after the registration committed, did not answer true")
	}
	return waiter
}

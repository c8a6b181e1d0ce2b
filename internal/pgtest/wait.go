package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Eventually polls cond every 10 ms until it holds, and fails the test when
// d passes first.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Querier is what WaitServerPast needs of a connection or pool (lease.Querier
// has it).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// WaitServerPast blocks until the server's clock has passed ts, sleeping on
// the server (at most a second at a time): sequencing on the server's own
// clock, not a local sleep.
func WaitServerPast(t testing.TB, q Querier, ts time.Time) {
	t.Helper()
	ctx := Context(t, 2*time.Minute)
	for {
		var past bool
		if err := q.QueryRow(ctx, `SELECT clock_timestamp() > $1::timestamptz`, ts).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if _, err := q.Exec(ctx,
			`SELECT pg_sleep(least(1, greatest(0.0001, extract(epoch FROM $1::timestamptz - clock_timestamp())))::double precision)`,
			ts); err != nil {
			t.Fatal(err)
		}
	}
}

// Slots bounds how many tests of a package run servers at once (the
// machines have two cores, and `go test ./...` runs other packages' servers
// beside them).
type Slots chan struct{}

// NewSlots is room for n at once.
func NewSlots(n int) Slots { return make(Slots, n) }

// Take waits up to 5 minutes for a slot (what names it in the failure) and
// gives it back at the test's cleanup.
func (s Slots) Take(t testing.TB, what string) {
	t.Helper()
	select {
	case s <- struct{}{}:
	case <-time.After(5 * time.Minute):
		t.Fatalf("no %s slot in 5 minutes", what)
	}
	t.Cleanup(func() { <-s })
}

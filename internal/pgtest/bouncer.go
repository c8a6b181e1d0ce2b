package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// Bouncer is pgserver.Bouncer.
type Bouncer = pgserver.Bouncer

// NewBouncer starts a real PgBouncer in pool mode ("session" or
// "transaction") in front of s, closes it with t.Cleanup, and fails the test
// (never skips) when it cannot start, naming what to install. The end of
// its log is logged when the test failed.
func NewBouncer(t testing.TB, s *Server, mode string) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgserver.StartBouncer(ctx, s, pgserver.BouncerOptions{PoolMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer (%s) log, last part:\n%s", mode, lastBytes(b.Log(), 8<<10))
		}
		if err := b.Close(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return b
}

// BouncerDSN is b.DSN(dsn), failing the test on error.
func BouncerDSN(t testing.TB, b *Bouncer, dsn string) string {
	t.Helper()
	d, err := b.DSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

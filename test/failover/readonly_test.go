package failover

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestStandbyAndReadOnlyErrors: every changing call on a standby, and in a
// read-only session on the primary, fails at once with lease.ErrReadOnly
// (SQLSTATE 25006, or 55000 "recovery is in progress"), never a hang and
// never an untyped error; inspect still answers on the standby.
func TestStandbyAndReadOnlyErrors(t *testing.T) {
	_, p, st := newPair(t, time.Minute)
	ctx := pgtest.Context(t, time.Minute)
	prim := lease.New(pgtest.Connect(t, dsn(p)))
	g, ok, err := prim.Acquire(ctx, "k", "owner", 30*time.Second)
	if err != nil || !ok {
		t.Fatalf("acquire on the primary: %v %v", ok, err)
	}
	if err := p.WaitReplayed(ctx, st); err != nil {
		t.Fatal(err)
	}
	roConn := pgtest.Connect(t, dsn(p))
	if _, err := roConn.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	for name, cl := range map[string]*lease.Client{
		"standby":                    lease.New(pgtest.Connect(t, dsn(st))),
		"read-only session, primary": lease.New(roConn),
	} {
		calls := map[string]func(context.Context) error{
			"acquire held": func(ctx context.Context) error { _, _, err := cl.Acquire(ctx, "k", "other", time.Second); return err },
			"acquire new":  func(ctx context.Context) error { _, _, err := cl.Acquire(ctx, "new", "other", time.Second); return err },
			"renew":        func(ctx context.Context) error { _, err := cl.Renew(ctx, g.Token, time.Second); return err },
			"release":      func(ctx context.Context) error { return cl.Release(ctx, g.Token) },
		}
		for call, f := range calls {
			cctx, cancel := opCtx(10 * time.Second)
			start := time.Now()
			err := f(cctx)
			cancel()
			if !errors.Is(err, lease.ErrReadOnly) {
				t.Errorf("%s: %s: %v (want lease.ErrReadOnly)", name, call, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s: %s took %v", name, call, d)
			}
		}
		s, err := cl.Inspect(ctx, "k")
		if err != nil || !s.Held || s.Epoch != g.Epoch {
			t.Errorf("%s: inspect: %+v, %v", name, s, err)
		}
	}
}

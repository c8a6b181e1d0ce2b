package elector_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// callCounter counts the lease calls sent on a pool's connections.
type callCounter struct{ acquire, inspect atomic.Int64 }

func (c *callCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.Contains(d.SQL, "lease.acquire("):
		c.acquire.Add(1)
	case strings.Contains(d.SQL, "lease.inspect("):
		c.inspect.Add(1)
	}
	return ctx
}

func (c *callCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *callCounter) String() string {
	return fmt.Sprintf("%d acquires, %d inspects", c.acquire.Load(), c.inspect.Load())
}

// newRole creates a login role (no superuser: a superuser is a member of
// every role, so it may act on any grant) and returns its name.
func newRole(t *testing.T, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if err := pgtest.Shared(t).CreateRole(testCtx(t), name, "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestSpoofedIdentityDoesNotSpin: another role (eve) holds the key under
// the elector's own identity. The server refuses the elector's acquire
// (grants are bound to the role that took them), and the elector follows
// eve's grant as another holder's: with the clock standing still it makes
// a handful of calls and then waits; each RetryInterval on the injected
// clock costs one read. It logs once, counts identity_taken, never leads
// while eve holds the key, and takes the key once eve releases it.
func TestSpoofedIdentityDoesNotSpin(t *testing.T) {
	dsn := installed(t, nil)
	app, eve := newRole(t, "pglease_app"), newRole(t, "pglease_eve")
	ctx := testCtx(t)

	eveClient := lease.New(newPool(t, pgtest.WithUser(dsn, eve)))
	eg, ok, err := eveClient.Acquire(ctx, "leader", "pod-b", time.Hour)
	if err != nil || !ok {
		t.Fatalf("eve's acquire: %v %v", ok, err)
	}

	calls := &callCounter{}
	pool := pgtest.NewPool(t, pgtest.WithUser(dsn, app), func(c *pgxpool.Config) { c.ConnConfig.Tracer = calls })
	fake := clocktesting.NewFakeClock(time.Now())
	var logged atomic.Int64
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "held under this elector's identity by another session") {
			logged.Add(1)
		}
	}, funcr.Options{})
	started := make(chan lease.Token, 1)
	const retry = time.Second
	reg := prometheus.NewRegistry()
	el, err := elector.New(lease.New(pool).WithClock(fake), elector.Config{
		Key: "leader", Identity: "pod-b", TTL: 15 * time.Second, RetryInterval: retry,
		Logger: logger, Registerer: reg,
		Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) {
			tok, _ := lease.TokenFromContext(ctx)
			started <- tok
			<-ctx.Done()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	runElector(t, el)

	// The elector settles into a wait on the fake clock. Code that spins
	// never waits on it and piles up calls instead.
	const spinning = 200
	pgtest.Eventually(t, time.Minute, "the elector to wait on its clock", func() bool {
		return fake.HasWaiters() || calls.acquire.Load() > spinning
	})
	// One acquire refused, a read of "pod-b", one more acquire (a handover
	// in flight would have been granted), a read: then wait.
	if a, i := calls.acquire.Load(), calls.inspect.Load(); a > 2 || i > 2 {
		t.Fatalf("before waiting: %s, want at most 2 of each", calls)
	}
	if s := el.Status(); s.Leading || !s.IdentityTaken || s.Leader != "pod-b" || s.Epoch != eg.Epoch {
		t.Errorf("status while eve holds the key: %+v", s)
	}

	// Each RetryInterval on the clock: one read, no acquire.
	before := calls.inspect.Load()
	const steps = 5
	for i := range steps {
		fake.Step(retry)
		pgtest.Eventually(t, time.Minute, fmt.Sprintf("read %d", i+1), func() bool {
			return calls.inspect.Load() >= before+int64(i+1) && fake.HasWaiters()
		})
	}
	if a, i := calls.acquire.Load(), calls.inspect.Load()-before; a > 2 || i != steps {
		t.Errorf("after %d steps of RetryInterval: %d acquires, %d reads, want 2 acquires and %d reads", steps, a, i, steps)
	}
	if n := logged.Load(); n != 1 {
		t.Errorf("logged %d times that another session holds the identity, want once", n)
	}
	if v := value(t, elector.ErrorsOf(el, "leader", "identity_taken")); v != 1 {
		t.Errorf("identity_taken errors: %v, want 1", v)
	}
	select {
	case tok := <-started:
		t.Fatalf("the elector led under %v while eve held the key", tok)
	default:
	}

	// eve releases: the next read sees the key free and the elector takes it.
	if err := eveClient.Release(ctx, eg.Token); err != nil {
		t.Fatal(err)
	}
	fake.Step(retry)
	select {
	case tok := <-started:
		if tok.Epoch <= eg.Epoch || tok.Owner != "pod-b" {
			t.Errorf("term %v after eve's %v", tok, eg.Token)
		}
	case <-time.After(time.Minute):
		t.Fatalf("no term within a minute of eve's release (%s)", calls)
	}
	if s := el.Status(); !s.Leading || s.IdentityTaken {
		t.Errorf("status while leading: %+v", s)
	}
}

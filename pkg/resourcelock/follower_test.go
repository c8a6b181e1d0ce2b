package resourcelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

func newWaiter(t *testing.T, dsn string) *listen.Waiter {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	w, err := listen.NewWaiter(context.Background(), cfg, listen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

type getResult struct {
	holder string
	epoch  int
	raw    []byte
	err    error
}

func getAsync(ctx context.Context, l *resourcelock.Lock) <-chan getResult {
	ch := make(chan getResult, 1)
	go func() {
		r, raw, err := l.Get(ctx)
		if err != nil {
			ch <- getResult{err: err}
			return
		}
		ch <- getResult{r.HolderIdentity, r.LeaderTransitions, raw, nil}
	}()
	return ch
}

// notYet fails if ch delivers within a short while: a wait for the defect
// to show, not a timed assertion (a slow machine can only hide it).
func notYet(t *testing.T, ch <-chan getResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Get returned %+v", what, r)
	case <-time.After(200 * time.Millisecond):
	}
}

func mustGet(t *testing.T, ch <-chan getResult) getResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	case <-time.After(time.Minute):
		t.Fatal("Get did not return")
	}
	return getResult{}
}

// TestFollowerGetWaitsForNews: with a Waiter, a follower's Get returns at
// once the first time, then, while another holds the key, waits while
// nothing that matters to an election happens (a renewal is not news), and
// returns at the release (notification) and at the server-side lapse (the
// grant's expiry), each reported as a free key. The holder's Get never
// waits, and a waiting Get returns its context's error when the context
// ends.
func TestFollowerGetWaitsForNews(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	w := newWaiter(t, dsn)
	h := mustLock(t, newClient(t, dsn), "k", "holder", resourcelock.Config{LeaseDuration: time.Minute, Waiter: w})
	f := mustLock(t, newClient(t, dsn), "k", "follower", resourcelock.Config{LeaseDuration: time.Minute, Waiter: w})
	if err := h.Create(ctx, rec("holder")); err != nil {
		t.Fatal(err)
	}
	if r := mustGet(t, getAsync(ctx, f)); r.holder != "holder" {
		t.Fatalf("first Get: %+v", r)
	}
	// The holder never waits (a Get that waited would outlast this context).
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	for range 2 {
		if _, _, err := h.Get(hctx); err != nil {
			t.Fatalf("holder's Get: %v", err)
		}
	}
	cancel()

	// Cancellation.
	cctx, cancelWait := context.WithCancel(ctx)
	waiting := getAsync(cctx, f)
	notYet(t, waiting, "nothing happened")
	cancelWait()
	if r := <-waiting; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("after cancel: %+v", r)
	}

	waiting = getAsync(ctx, f)
	notYet(t, waiting, "nothing happened")
	if err := h.Update(ctx, rec("holder")); err != nil { // renew
		t.Fatal(err)
	}
	notYet(t, waiting, "after a renewal")
	if err := h.Update(ctx, rec("")); err != nil { // release
		t.Fatal(err)
	}
	if r := mustGet(t, waiting); r.holder != "" || r.epoch != 2 {
		t.Fatalf("after the release: %+v, want the key free at epoch 2", r)
	}

	// A lapse, decided by the server, wakes it at the grant's expiry. The
	// follower must read the grant first: when the server says it lapsed
	// before that read, it is granted again, twice as long.
	admin := newClient(t, dsn)
	// epoch is the grant's: 3 on the first try; after a redo, any epoch
	// above the last one read.
	for ttl, epoch, last := 1500*time.Millisecond, 3, 2; ; ttl *= 2 {
		short := mustLock(t, newClient(t, dsn), "k", "short", resourcelock.Config{LeaseDuration: ttl})
		if _, _, err := short.Get(ctx); err != nil {
			t.Fatal(err)
		}
		if err := short.Update(ctx, rec("short")); err != nil {
			// Answered past its local deadline: of no use.
			if !errors.Is(err, lease.ErrLocalDeadline) {
				t.Fatal(err)
			}
			pgtest.WaitLapsed(t, admin, "k", time.Minute)
			r := mustGet(t, getAsync(ctx, f))
			if r.holder != "" || r.epoch <= last {
				t.Fatalf("after the late grant to short lapsed: %+v, want the key free above epoch %d", r, last)
			}
			t.Logf("the grant of %v came past its deadline; again with a longer one", ttl)
			epoch, last = 0, r.epoch
			continue
		}
		r := mustGet(t, getAsync(ctx, f))
		if epoch == 0 && r.epoch > last {
			epoch = r.epoch
		}
		if r.holder == "" && r.epoch == epoch {
			s, err := admin.Inspect(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if s.Held || s.Epoch != int64(epoch) {
				t.Fatalf("after the grant to short: %+v, the server says %+v", r, s)
			}
			t.Logf("the grant of %v lapsed before the follower read it; again with a longer one", ttl)
			epoch, last = 0, r.epoch
			continue
		}
		if r.holder != "short" || r.epoch != epoch {
			t.Fatalf("after the grant to short: %+v, want short at epoch %d", r, epoch)
		}
		if r := mustGet(t, getAsync(ctx, f)); r.holder != "" || r.epoch != epoch {
			t.Fatalf("after short's grant lapsed: %+v, want the key free at epoch %d", r, epoch)
		}
		break
	}
}

// TestFollowerGetAfterFailedAcquireReadsAtOnce: a follower that last read
// the key free (or absent) and whose acquire then failed (a connection lost
// in a failover) reads at once on its next Get. No change will come to wake
// a wait: every candidate in the same place would wait for the others.
func TestFollowerGetAfterFailedAcquireReadsAtOnce(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	w := newWaiter(t, dsn)
	failed, stop := context.WithCancel(ctx)
	stop()

	// Absent: Get gives NotFound, Create fails, Get again.
	f := mustLock(t, newClient(t, dsn), "k", "follower", resourcelock.Config{LeaseDuration: time.Minute, Waiter: w})
	if _, _, err := f.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("first Get of an absent key: %v, want NotFound", err)
	}
	if err := f.Create(failed, rec("follower")); err == nil {
		t.Fatal("Create with a cancelled context succeeded")
	}
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, _, err := f.Get(gctx)
	cancel()
	if !apierrors.IsNotFound(err) {
		t.Fatalf("Get after a failed Create of an absent key: %v, want NotFound at once", err)
	}

	// Free: Get gives the free record, Update fails, Get again.
	h := mustLock(t, newClient(t, dsn), "k", "holder", resourcelock.Config{LeaseDuration: time.Minute})
	if err := h.Create(ctx, rec("holder")); err != nil {
		t.Fatal(err)
	}
	if err := h.Update(ctx, rec("")); err != nil { // release
		t.Fatal(err)
	}
	if r := mustGet(t, getAsync(ctx, f)); r.holder != "" {
		t.Fatalf("Get after the release: %+v, want the key free", r)
	}
	if err := f.Update(failed, rec("follower")); err == nil {
		t.Fatal("Update with a cancelled context succeeded")
	}
	gctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	r, _, err := f.Get(gctx)
	cancel()
	if err != nil || r.HolderIdentity != "" {
		t.Fatalf("Get after a failed acquire of a free key: %+v, %v, want the free record at once", r, err)
	}
}

// stalled is a Querier whose every call blocks until its context ends, as
// on a connection that died without a word.
type stalled struct{}

func (stalled) Exec(ctx context.Context, _ string, _ ...any) (pgconn.CommandTag, error) {
	<-ctx.Done()
	return pgconn.CommandTag{}, ctx.Err()
}

func (stalled) Query(ctx context.Context, _ string, _ ...any) (pgx.Rows, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

type stalledRow struct{ ctx context.Context }

func (r stalledRow) Scan(...any) error { <-r.ctx.Done(); return r.ctx.Err() }

func (stalled) QueryRow(ctx context.Context, _ string, _ ...any) pgx.Row { return stalledRow{ctx} }

// TestFollowerCallsHaveDeadlines: client-go's acquire loop calls Get,
// Create and Update with a context without deadline; on a connection that
// stalls, each returns an error (after the lock's lease duration) instead
// of hanging.
func TestFollowerCallsHaveDeadlines(t *testing.T) {
	l := mustLock(t, lease.New(stalled{}), "k", "a", resourcelock.Config{LeaseDuration: time.Second})
	done := make(chan error, 3)
	go func() {
		_, _, err := l.Get(context.Background())
		done <- err
		done <- l.Create(context.Background(), rec("a"))
		done <- l.Update(context.Background(), rec("a"))
	}()
	for _, call := range []string{"Get", "Create", "Update"} {
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "before any Get") {
				t.Fatalf("%s on a stalled connection: %v, want a deadline error", call, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s on a stalled connection did not return", call)
		}
	}
}

func TestLeaderElectionConfig(t *testing.T) {
	c := lease.New(nil)
	lock := mustLock(t, c, "k", "a", resourcelock.Config{LeaseDuration: 15 * time.Second})
	cfg, err := lock.LeaderElectionConfig(leaderelection.LeaderElectionConfig{})
	if err != nil || cfg.Lock != lock || cfg.LeaseDuration != 15*time.Second || cfg.RenewDeadline != 10*time.Second || cfg.RetryPeriod != 2*time.Second {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	// Timings set in the Config are the ones filled in.
	set := mustLock(t, c, "k", "a", resourcelock.Config{LeaseDuration: 15 * time.Second, RenewDeadline: 8 * time.Second, RetryPeriod: time.Second})
	if cfg, err := set.LeaderElectionConfig(leaderelection.LeaderElectionConfig{}); err != nil ||
		cfg.LeaseDuration != 15*time.Second || cfg.RenewDeadline != 8*time.Second || cfg.RetryPeriod != time.Second {
		t.Fatalf("the Config's timings: %+v, %v", cfg, err)
	}
	one := mustLock(t, c, "k", "a", resourcelock.Config{LeaseDuration: time.Second})
	if _, err := one.LeaderElectionConfig(leaderelection.LeaderElectionConfig{
		LeaseDuration: time.Second, RenewDeadline: 700 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
	}); err != nil {
		t.Fatalf("1s / 700ms / 100ms: %v", err)
	}
	other := mustLock(t, c, "other", "a")
	for _, tc := range []struct {
		name string
		cfg  leaderelection.LeaderElectionConfig
		want []string
	}{
		{"outlives the grant", leaderelection.LeaderElectionConfig{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond},
			[]string{"RenewDeadline (1.5s) + RetryPeriod (200ms)", "lease duration (1s)"}},
		{"client-go's own rules", leaderelection.LeaderElectionConfig{LeaseDuration: 500 * time.Millisecond, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 500 * time.Millisecond},
			[]string{"LeaseDuration (500ms) must be greater than RenewDeadline (600ms)", "RenewDeadline (600ms) must be greater than RetryPeriod (500ms)"}},
		{"negative retry", leaderelection.LeaderElectionConfig{RetryPeriod: -1}, []string{"RetryPeriod (-1ns) must be positive"}},
		{"another lock", leaderelection.LeaderElectionConfig{Lock: other}, []string{"Lock: is pg_lease/other"}},
	} {
		_, err := one.LeaderElectionConfig(tc.cfg)
		if !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("%s: %v, want an error matching lease.ErrInvalidInput", tc.name, err)
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
			}
		}
	}
}

// TestReleaseSurvivesADeadPooledConnection: client-go's release is one Get
// and one Update, retried only on Conflict. With the pool's only connection
// terminated while idle, the release still frees the key (one retry on a
// connection-level error), so the successor need not wait the TTL.
func TestReleaseSurvivesADeadPooledConnection(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	pool := pgtest.NewPool(t, dsn, pgtest.MaxConns(1))
	admin := newPool(t, dsn)
	a := mustLock(t, lease.New(pool), "k", "a", resourcelock.Config{LeaseDuration: time.Hour})
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	for { // until the backend is gone (a wait on the server, not a sleep)
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if err := a.Update(ctx, rec("")); err != nil {
		t.Fatalf("release on a pool whose connection died: %v", err)
	}
	if s, err := lease.New(admin).Inspect(ctx, "k"); err != nil || s.Held {
		t.Fatalf("after the release: %+v, %v", s, err)
	}
}

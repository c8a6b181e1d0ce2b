package leaderelection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func newClient(t *testing.T) (*lease.Client, string) {
	t.Helper()
	dsn := pgtest.NewLeaseDatabase(t)
	return lease.New(newPool(t, dsn)), dsn
}

// configure (NewManager's setup of the options) installs the lock, wrapped,
// and fills and checks the timings with the lock's rule.
func TestConfigure(t *testing.T) {
	lock, err := resourcelock.New(lease.New(nil), resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	configure := func(opts *manager.Options, l *resourcelock.Lock) error {
		_, err := pgle.Configure(opts, l)
		return err
	}
	opts := manager.Options{LeaderElectionReleaseOnCancel: true}
	if err := configure(&opts, lock); err != nil {
		t.Fatal(err)
	}
	obs, ok := opts.LeaderElectionResourceLockInterface.(*pgle.ObservedLock)
	if !ok || obs.Interface != rl.Interface(lock) || pgle.ObservedPgLock(obs) != lock {
		t.Fatalf("LeaderElectionResourceLockInterface = %T, want an ObservedLock of the lock", opts.LeaderElectionResourceLockInterface)
	}
	if !opts.LeaderElection || !opts.LeaderElectionReleaseOnCancel ||
		opts.LeaderElectionID != "k" || *opts.LeaseDuration != 15*time.Second || *opts.RenewDeadline != 10*time.Second ||
		*opts.RetryPeriod != 2*time.Second {
		t.Fatalf("options: %+v LD %v RD %v RP %v", opts, *opts.LeaseDuration, *opts.RenewDeadline, *opts.RetryPeriod)
	}
	d := func(v time.Duration) *time.Duration { return &v }
	for _, tc := range []struct {
		name string
		opts manager.Options
		want string
	}{
		{"renew deadline past the TTL", manager.Options{RenewDeadline: d(14 * time.Second)}, "RenewDeadline (14s) + RetryPeriod (2s) = 16s must be below"},
		{"lease duration not above renew deadline", manager.Options{LeaseDuration: d(5 * time.Second), RenewDeadline: d(6 * time.Second)}, "LeaseDuration (5s) must be greater than RenewDeadline"},
		{"retry period too long", manager.Options{RetryPeriod: d(9 * time.Second)}, "RenewDeadline (10s) must be greater than RetryPeriod"},
		{"negative retry", manager.Options{RetryPeriod: d(-time.Second)}, "RetryPeriod (-1s) must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := configure(&tc.opts, lock)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
			if tc.opts.LeaderElection {
				t.Fatal("options changed despite the error")
			}
		})
	}
	for _, ttl := range []time.Duration{1500 * time.Millisecond, 2 * time.Second, 15 * time.Second, time.Minute} {
		l, err := resourcelock.New(lease.New(nil), resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: ttl})
		if err != nil {
			t.Fatal(err)
		}
		var opts manager.Options
		if err := configure(&opts, l); err != nil {
			t.Errorf("the default timings for TTL %v fail the lock's check: %v", ttl, err)
		}
	}
}

type recordingReconciler struct {
	mu     sync.Mutex
	tokens []lease.Token
	block  chan struct{} // when set, Reconcile waits for it or ctx
}

func (r *recordingReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	tok, ok := lease.TokenFromContext(ctx)
	if !ok {
		return reconcile.Result{}, errors.New("no token in the context")
	}
	r.mu.Lock()
	r.tokens = append(r.tokens, tok)
	r.mu.Unlock()
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
			return reconcile.Result{}, ctx.Err()
		}
	}
	return reconcile.Result{}, nil
}

func TestFenced(t *testing.T) {
	client, _ := newClient(t)
	ctx := context.Background()
	lock, err := resourcelock.New(client, resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	inner := &recordingReconciler{}
	r := pgle.Fenced(lock, reconcile.TypedReconciler[reconcile.Request](inner))
	if _, err := r.Reconcile(ctx, reconcile.Request{}); !errors.Is(err, resourcelock.ErrNotHolding) || len(inner.tokens) != 0 {
		t.Fatalf("without a grant: %v, %d calls", err, len(inner.tokens))
	}
	if err := lock.Create(ctx, rl.LeaderElectionRecord{HolderIdentity: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if len(inner.tokens) != 1 || inner.tokens[0] != (lease.Token{Key: "k", Owner: "a", Epoch: 1}) {
		t.Fatalf("tokens %v", inner.tokens)
	}
	// The epoch ends during a reconcile: its context is cancelled and the
	// request fails (requeued), whatever the reconciler says.
	inner.block = make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := r.Reconcile(ctx, reconcile.Request{})
		errc <- err
	}()
	for {
		inner.mu.Lock()
		n := len(inner.tokens)
		inner.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := lock.Update(ctx, rl.LeaderElectionRecord{}); err != nil { // release
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, pgle.ErrEpochEnded) || !errors.Is(err, lease.ErrReleased) {
		t.Fatalf("reconcile across the end of its epoch: %v", err)
	}
	if _, err := r.Reconcile(ctx, reconcile.Request{}); !errors.Is(err, resourcelock.ErrNotHolding) {
		t.Fatalf("after release: %v", err)
	}
}

// The lock's metrics are in controller-runtime's registry: the epoch at
// scrape time, terms started and stopped, renewal latency, and conflicts.
func TestObservedLockMetrics(t *testing.T) {
	client, _ := newClient(t)
	// The metrics are process-global, keyed by the lock's key: a key of its
	// own per run, so that -count=N repetitions do not add up.
	key := fmt.Sprintf("metrics-%s-%d", t.Name(), time.Now().UnixNano())
	observed := func(id string) *pgle.ObservedLock { // id's lock on key, observed
		t.Helper()
		lock, err := resourcelock.New(client, resourcelock.Config{Key: key, Identity: id, LeaseDuration: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		obs, err := pgle.Observe(lock, lock)
		if err != nil {
			t.Fatal(err)
		}
		return obs
	}
	obs := observed("a")
	ctx := context.Background()
	ler := rl.LeaderElectionRecord{HolderIdentity: "a"}
	if err := obs.Create(ctx, ler); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := obs.Update(ctx, ler); err != nil { // renewals
			t.Fatal(err)
		}
	}
	obsB := observed("b")
	// b follows the holder (Get), then tries to take the key (Update): a
	// conflict. (An Update before any Get or Create is a BadRequest.)
	if _, _, err := obsB.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := obsB.Update(ctx, rl.LeaderElectionRecord{HolderIdentity: "b"}); err == nil {
		t.Fatal("b acquired a held key")
	}
	got := gather(t, key)
	for name, want := range map[string]float64{
		"pg_lease_lock_epoch":                        1,
		"pg_lease_lock_transitions_total/started":    1,
		"pg_lease_lock_renew_duration_seconds/count": 3,
		"pg_lease_lock_errors_total/conflict/update": 1, // labels in name order: kind, op
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], want, got)
		}
	}
	if err := obs.Update(ctx, rl.LeaderElectionRecord{}); err != nil { // release
		t.Fatal(err)
	}
	got = gather(t, key)
	if got["pg_lease_lock_epoch"] != 0 || got["pg_lease_lock_transitions_total/stopped"] != 1 {
		t.Errorf("after release: %v", got)
	}
}

// gather reads the registry's series of key, named metric[/label values].
func gather(t *testing.T, key string) map[string]float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "pg_lease_lock_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			mine := false
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "key":
					mine = lp.GetValue() == key
				default:
					name += "/" + lp.GetValue()
				}
			}
			if !mine {
				continue
			}
			switch {
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			case m.Histogram != nil:
				out[name+"/count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// Configure leaves LeaderElectionReleaseOnCancel as the caller set it.
func TestConfigureReleaseOnCancel(t *testing.T) {
	lock, err := resourcelock.New(lease.New(nil), resourcelock.Config{Key: "k", Identity: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, release := range []bool{false, true} {
		opts := manager.Options{LeaderElectionReleaseOnCancel: release}
		if _, err := pgle.Configure(&opts, lock); err != nil {
			t.Fatal(err)
		}
		if opts.LeaderElectionReleaseOnCancel != release {
			t.Errorf("Configure changed LeaderElectionReleaseOnCancel from %v", release)
		}
	}
}

// Configure takes the pg_lease lock out of a ResourceLock and of a
// migration lock, and refuses a lock that has none.
func TestConfigureFindsThePgLeaseLock(t *testing.T) {
	pg, err := resourcelock.New(lease.New(nil), resourcelock.Config{Key: "ns/k", Identity: "a"})
	if err != nil {
		t.Fatal(err)
	}
	mig, err := pgle.NewMigrationLock(pg, pg)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []rl.Interface{pg, mig, &pgle.ResourceLock{Interface: pg, Lock: pg}} {
		var opts manager.Options
		obs, err := pgle.Configure(&opts, l)
		if err != nil {
			t.Fatalf("%T: %v", l, err)
		}
		if pgle.ObservedPgLock(obs) != pg {
			t.Errorf("%T: observed pg_lease lock %v, want the lock's", l, pgle.ObservedPgLock(obs))
		}
	}
	var opts manager.Options
	if _, err := pgle.Configure(&opts, &pgle.ResourceLock{Interface: &rl.LeaseLock{}}); !errors.Is(err, pgle.ErrInvalidConfig) {
		t.Errorf("a leases resource lock: %v, want ErrInvalidConfig", err)
	}
}

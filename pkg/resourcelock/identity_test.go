package resourcelock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// watched is a real Lock seen through client-go's eyes: before each Get
// (from the second on, after client-go has acted on the previous record)
// it asks the elector whether it believes it leads, and it records the
// holder every Get shows.
type watched struct {
	*resourcelock.Lock
	le *atomic.Pointer[leaderelection.LeaderElector]

	mu       sync.Mutex
	gets     int
	leaderAt []int    // the Gets before which IsLeader() was true
	holders  []string // HolderIdentity of every record Get returned
}

func (w *watched) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	w.mu.Lock()
	w.gets++
	if le := w.le.Load(); le != nil && le.IsLeader() {
		w.leaderAt = append(w.leaderAt, w.gets)
	}
	w.mu.Unlock()
	r, raw, err := w.Lock.Get(ctx)
	if err == nil {
		w.mu.Lock()
		w.holders = append(w.holders, r.HolderIdentity)
		w.mu.Unlock()
	}
	return r, raw, err
}

func (w *watched) snapshot() (gets int, leaderAt []int, holders []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gets, append([]int(nil), w.leaderAt...), append([]string(nil), w.holders...)
}

// TestSpoofedIdentityIsNotLeadership: another database role (eve) holds the
// key under the candidate's identity. client-go's real LeaderElector on the
// lock never believes it leads (IsLeader stays false, OnStartedLeading does
// not run, OnNewLeader never names its own identity) while eve holds the
// key, whether its Get polls or waits for news; once eve releases, it takes
// the key.
func TestSpoofedIdentityIsNotLeadership(t *testing.T) {
	t.Run("poll", func(t *testing.T) { testSpoofedIdentity(t, false) })
	t.Run("waiter", func(t *testing.T) { testSpoofedIdentity(t, true) })
}

func testSpoofedIdentity(t *testing.T, useWaiter bool) {
	dsn := newDB(t)
	ctx := pgtest.Context(t, 3*time.Minute)
	roles := make([]string, 2)
	for i, prefix := range []string{"pglease_app", "pglease_eve"} {
		roles[i] = fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
		if err := pgtest.Shared(t).CreateRole(ctx, roles[i], "LOGIN NOSUPERUSER"); err != nil {
			t.Fatal(err)
		}
	}
	app, eve := roles[0], roles[1]
	const key, id = "leader", "pod-b"

	eveClient := lease.New(newPool(t, pgtest.WithUser(dsn, eve)))
	eg, ok, err := eveClient.Acquire(ctx, key, id, time.Hour)
	if err != nil || !ok {
		t.Fatalf("eve's acquire: %v %v", ok, err)
	}

	pool := newPool(t, pgtest.WithUser(dsn, app))
	opts := resourcelock.Config{LeaseDuration: testTTL}
	if useWaiter {
		w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		opts.Waiter = w
	}
	lock := &watched{Lock: mustLock(t, lease.New(pool), key, id, opts), le: &atomic.Pointer[leaderelection.LeaderElector]{}}
	started := make(chan lease.Token, 1)
	var (
		newLeaderMu sync.Mutex
		newLeaders  []string
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: key,
		LeaseDuration: testTTL, RenewDeadline: testRenewDeadline, RetryPeriod: testRetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				tok, _ := lock.Token()
				started <- tok
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				newLeaderMu.Lock()
				newLeaders = append(newLeaders, identity)
				newLeaderMu.Unlock()
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	lock.le.Store(le)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); le.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Let client-go act on what it read: a polling follower Gets every
	// RetryPeriod; a waiting one Gets a second time and waits there for
	// news (none comes while eve holds the key).
	wantGets := 5
	if useWaiter {
		wantGets = 2
	}
	pgtest.Eventually(t, time.Minute, fmt.Sprintf("%d Gets", wantGets), func() bool {
		n, _, _ := lock.snapshot()
		return n >= wantGets
	})
	gets, leaderAt, holders := lock.snapshot()
	if len(leaderAt) > 0 || le.IsLeader() {
		t.Errorf("client-go believed it led while eve held the key under its identity: before Gets %v of %d (now %v)",
			leaderAt, gets, le.IsLeader())
	}
	for _, h := range holders {
		if h != id+resourcelock.TakenSuffix {
			t.Errorf("Get showed holder %q while eve held the key, want %q", h, id+resourcelock.TakenSuffix)
		}
	}
	newLeaderMu.Lock()
	for _, n := range newLeaders {
		if n == id {
			t.Errorf("OnNewLeader(%q) while eve held the key", n)
		}
	}
	newLeaderMu.Unlock()
	select {
	case tok := <-started:
		t.Fatalf("OnStartedLeading ran (token %v) while eve held the key", tok)
	default:
	}
	if _, ok := lock.Token(); ok {
		t.Error("the lock hands out a token while eve holds the key")
	}

	// eve releases: client-go takes the key under a new epoch.
	released := time.Now()
	t.Logf("%d Gets while eve held the key", gets)
	if err := eveClient.Release(ctx, eg.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case tok := <-started:
		if tok.Owner != id || tok.Epoch <= eg.Epoch {
			t.Errorf("led under %v after eve's %v", tok, eg.Token)
		}
		t.Logf("led under %v %v after eve's release", tok, time.Since(released).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatal("client-go did not lead within a minute of eve's release")
	}
	if !le.IsLeader() {
		t.Error("IsLeader false while leading")
	}
}

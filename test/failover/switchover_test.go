package failover

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgserver"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestHolderKeepsLeadingThroughSwitchover: an elector leads on a multi-host
// DSN with a grant the standby has replayed; the primary stops cleanly (a
// planned switchover) and the standby is promoted, faster than the term's
// remaining time. The leader's renewals fail while no primary accepts
// writes, then succeed on the new primary: same term, same epoch, no leader
// change. Its first renewal there records the promotion, so the grace starts
// then (pg_lease 0.4.0), not at some later grant.
func TestHolderKeepsLeadingThroughSwitchover(t *testing.T) {
	// A long term: on a loaded machine a stop and promotion took 5.4 s. The
	// test waits for the switchover and one renewal, never for the term.
	const ttl = time.Minute
	_, p, st := newPair(t, ttl)
	ctx := pgtest.Context(t, 3*time.Minute)
	multi := pgserver.MultiHostDSN(dbName, p, st)

	var (
		mu      sync.Mutex
		terms   int
		ended   bool
		started = make(chan struct{})
	)
	el, err := elector.New(lease.New(pool(t, multi)), elector.Config{
		Key: "job", Identity: "leader", TTL: ttl, RenewInterval: time.Second,
		Callbacks: elector.Callbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				terms++
				first := terms == 1
				mu.Unlock()
				if first {
					close(started)
				}
				<-lctx.Done()
			},
			OnStoppedLeading: func() {
				mu.Lock()
				ended = true
				mu.Unlock()
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runEnded := make(chan struct{})
	go func() { _ = el.Run(runCtx); close(runEnded) }()
	defer func() { stopRun(); <-runEnded }()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the elector never led")
	}
	g := el.Status().Grant
	if err := p.WaitReplayed(ctx, st); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	switched := time.Since(begin)
	// Wait for a renewal on the new primary: the server's expiry moves past
	// the one the standby had from the old primary.
	obs := lease.New(pgtest.Connect(t, dsn(st)))
	var after lease.State
	for {
		s, err := obs.Inspect(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if s.ExpiresAt.After(g.ExpiresAt) && s.Owner == "leader" {
			after = s
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no renewal on the promoted server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	n, e := terms, ended
	mu.Unlock()
	t.Logf("switchover (clean stop, promotion) took %v; the leader renewed on the new primary, epoch %d", switched.Round(time.Millisecond), after.Epoch)
	if switched >= ttl/2 {
		t.Fatalf("the switchover took %v: too slow to test a switchover shorter than the term", switched)
	}
	if n != 1 || e || after.Epoch != g.Epoch || el.Status().Grant.Epoch != g.Epoch {
		t.Fatalf("terms %d, ended %t, epoch %d -> %d (server) / %d (elector): want one uninterrupted term",
			n, e, g.Epoch, after.Epoch, el.Status().Grant.Epoch)
	}
	var recorded bool
	if err := pgtest.Connect(t, dsn(st)).QueryRow(ctx,
		"SELECT timeline = lease._timeline() AND grace_until IS NOT NULL FROM lease.status()").Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if !recorded {
		t.Fatal("the renewal on the new primary did not record the promotion")
	}
}

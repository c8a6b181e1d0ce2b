package failover

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestLostRenewalEndsBeforeSuccessor: an elector leads with a grant the
// asynchronous standby has replayed; the standby is cut off, the leader
// renews once more (acknowledged by the primary, never replayed: the
// standby still has the older, earlier expiry), the primary is killed and
// the standby promoted. The old leader stays with the old primary (a client
// partitioned with it), so its term ends at its local deadline, formed from
// the lost renewal. A successor polls acquire on the promoted server. On
// this process's monotonic clock the old leader's token context ends before
// the successor's successful acquire is even sent.
func TestLostRenewalEndsBeforeSuccessor(t *testing.T) {
	const ttl = 2 * time.Second
	_, p, st := newPair(t, ttl)
	ctx := pgtest.Context(t, 3*time.Minute)

	var (
		mu       sync.Mutex
		started  = make(chan struct{})
		doneAt   time.Time
		cause    error
		epoch    int64
		runCtx   context.Context
		stopRun  context.CancelFunc
		runEnded = make(chan struct{})
	)
	runCtx, stopRun = context.WithCancel(context.Background())
	el, err := elector.New(lease.New(pool(t, dsn(p))), elector.Config{
		Key: "job", Identity: "old-leader", TTL: ttl,
		Callbacks: elector.Callbacks{OnStartedLeading: func(lctx context.Context) {
			tok, _ := lease.TokenFromContext(lctx)
			mu.Lock()
			if epoch != 0 {
				mu.Unlock()
				<-lctx.Done()
				return
			}
			epoch = tok.Epoch
			mu.Unlock()
			close(started)
			<-lctx.Done()
			at := time.Now()
			mu.Lock()
			doneAt, cause = at, context.Cause(lctx)
			mu.Unlock()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = el.Run(runCtx); close(runEnded) }()
	defer func() { stopRun(); <-runEnded }()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the elector never led")
	}
	cutOff(t, ctx, p, st)
	// Wait for a renewal after the cut: acknowledged, never replayed.
	before := el.Status().Grant.ExpiresAt
	for el.Status().Grant.ExpiresAt.Equal(before) {
		if ctx.Err() != nil {
			t.Fatal("no renewal after the cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	lostRenewal := el.Status()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	succ := lease.New(pgtest.Connect(t, dsn(st)))
	var inv time.Time
	var g lease.Grant
	for {
		inv = time.Now()
		var ok bool
		g, ok, err = succ.Acquire(ctx, "job", "successor", ttl)
		if errors.Is(err, lease.ErrGrace) {
			err, ok = nil, false // the promotion's grace: denied, asked again (polling, as before 0.4.0)
		}
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	granted := time.Now()
	// The old leader's term must have ended by now in any case.
	for {
		mu.Lock()
		d := doneAt
		mu.Unlock()
		if !d.IsZero() {
			break
		}
		if time.Since(granted) > 10*time.Second {
			t.Fatalf("the old leader's term (epoch %d) did not end within 10 s of the successor's grant", epoch)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("old leader epoch %d, lost renewal's local deadline %v after the promotion; its term ended (%v) %v after the promotion; successor's epoch %d acquire sent %v and acknowledged %v after the promotion",
		epoch, lostRenewal.Deadline.Sub(promoted).Round(time.Millisecond), cause, doneAt.Sub(promoted).Round(time.Millisecond),
		g.Epoch, inv.Sub(promoted).Round(time.Millisecond), granted.Sub(promoted).Round(time.Millisecond))
	if !doneAt.Before(inv) {
		t.Errorf("the old leader's token context ended %v after the successor's acquire (epoch %d) was sent: two holders believed at once",
			doneAt.Sub(inv).Round(time.Millisecond), g.Epoch)
	}
	if g.Epoch <= epoch {
		t.Errorf("successor's epoch %d is not above the old leader's %d", g.Epoch, epoch)
	}
}

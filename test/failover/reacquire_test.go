package failover

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestLostReleaseNotResurrected: A holds the key (replayed by the
// asynchronous standby); the standby is cut off; A releases and B takes the
// key (both acknowledged by the old primary only: B now believes it holds
// it, with its grant's TTL); the primary is killed and the standby promoted.
// On the promoted server A's grant still looks live, and A, with the same
// owner string, asks again (a restarted process with a stable identity, a
// client-go candidate with its pod name). Until B's belief has ended, A must
// not be told it holds the key: the idempotent acquire must not return the
// grant A released. (Found by TestRobustnessFailover.)
func TestLostReleaseNotResurrected(t *testing.T) {
	const ttl = 2 * time.Second
	_, p, st := newPair(t, ttl)
	ctx := pgtest.Context(t, 2*time.Minute)
	old := lease.New(pgtest.Connect(t, dsn(p)))
	ga, ok, err := old.Acquire(ctx, "k", "A", ttl)
	if err != nil || !ok {
		t.Fatalf("A's acquire: %v %v", ok, err)
	}
	cutOff(t, ctx, p, st)
	if err := old.Release(ctx, ga.Token); err != nil {
		t.Fatal(err)
	}
	bInv := time.Now()
	gb, ok, err := old.Acquire(ctx, "k", "B", ttl)
	if err != nil || !ok {
		t.Fatalf("B's acquire: %v %v", ok, err)
	}
	// B's belief, on this clock, ends no later than this (its grant's TTL
	// from before it sent the acquire).
	bBelief := bInv.Add(ttl)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	cl := lease.New(pgtest.Connect(t, dsn(st)))
	for {
		inv := time.Now()
		g, ok, err := cl.Acquire(ctx, "k", "A", ttl)
		if errors.Is(err, lease.ErrGrace) {
			err, ok = nil, false // the promotion's grace: denied, asked again (polling, as before 0.4.0)
		}
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Logf("A's acquire on the promoted server granted epoch %d %v after the promotion; B (epoch %d) believed until %v after it",
				g.Epoch, time.Since(promoted).Round(time.Millisecond), gb.Epoch, bBelief.Sub(promoted).Round(time.Millisecond))
			if inv.Before(bBelief) {
				t.Errorf("A was granted the key (epoch %d; it had released epoch %d) %v before B's belief (epoch %d) could end",
					g.Epoch, ga.Epoch, bBelief.Sub(inv).Round(time.Millisecond), gb.Epoch)
			}
			if g.Epoch <= gb.Epoch {
				t.Errorf("A's grant after the promotion has epoch %d, not above B's lost %d", g.Epoch, gb.Epoch)
			}
			return
		}
		if time.Since(promoted) > 30*time.Second {
			t.Fatal("A never got the key back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

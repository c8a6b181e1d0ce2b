package failure

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Server clock discontinuity (libfaketime: pgtest.Options.FakeClock and
// SetClockOffset). pg_lease reads clock_timestamp(), the server's wall clock.
//   - A forward jump past a grant's expiry lapses it at once: another owner
//     takes over though little real time passed, while the former holder's
//     local trust window (ValidUntil) still runs.
//   - A backward jump extends a grant in real time by the jump, and revives a
//     lapsed grant that nobody took over, but never gives two owners at once
//     in server time, and epochs keep increasing.
//
// The numbers logged with "CLOCK" are quoted in specs/FAILURE-MODEL.md.
func TestServerClockJumps(t *testing.T) {
	e := newEnv(t, pgtest.Options{FakeClock: true})
	ctx := pgtest.Context(t, 2*time.Minute)
	admin := e.connect(t)
	cl := map[string]*lease.Client{}
	for _, o := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		cl[o] = e.client(t)
	}
	obs := e.client(t)
	setOffset := func(d time.Duration) {
		t.Helper()
		if err := e.srv.SetClockOffset(d); err != nil {
			t.Fatal(err)
		}
	}
	// epochs granted per key, in grant order: must strictly increase.
	granted := map[string][]int64{}
	grant := func(owner, key string, ttl time.Duration) lease.Grant {
		t.Helper()
		g := mustAcquire(t, cl[owner], key, owner, ttl)
		if prev := granted[key]; len(prev) > 0 && g.Epoch <= prev[len(prev)-1] {
			t.Fatalf("%s granted %s at epoch %d after epoch %d was granted (I2/I3)", owner, key, g.Epoch, prev[len(prev)-1])
		}
		granted[key] = append(granted[key], g.Epoch)
		return g
	}
	denied := func(owner, key string) {
		t.Helper()
		if _, ok, err := cl[owner].Acquire(ctx, key, owner, time.Minute); err != nil || ok {
			t.Fatalf("%s's acquire of %s: ok=%t err=%v, want denied (two owners at once)", owner, key, ok, err)
		}
	}

	// Forward jump of 10 s during a 5 s grant.
	ga := grant("a", "k", 5*time.Second)
	t0 := time.Now()
	setOffset(10 * time.Second)
	s := inspect(t, obs, "k")
	if s.Held {
		t.Fatalf("after a forward jump past the expiry: %s, want lapsed at once", stateString(s))
	}
	realHeld := time.Since(t0)
	gb := grant("b", "k", 2*time.Second)
	belief := time.Until(ga.ValidUntil())
	rowB, _ := rawRow(t, admin, "k")
	if rowB.AcquiredAt.Before(ga.ExpiresAt) {
		t.Errorf("b's grant began at %s, before a's expiry %s in server time", rowB.AcquiredAt, ga.ExpiresAt)
	}
	if _, err := cl["a"].Renew(ctx, ga.Token, 5*time.Second); !errors.Is(err, lease.ErrLapsed) {
		t.Errorf("a's renew after the jump: %v, want lapsed", err)
	}
	t.Logf("CLOCK forward +10s: a's 5s grant lapsed after %v of real time; b took over at epoch %d while a's ValidUntil still had %v to run (client-side overlap)",
		realHeld.Round(time.Millisecond), gb.Epoch, belief.Round(time.Millisecond))

	// Backward jump of 30 s (offset +10 s -> -20 s) during b's 2 s grant.
	before := inspect(t, obs, "k")
	setOffset(-20 * time.Second)
	s = inspect(t, obs, "k")
	if !s.Held || s.Owner != "b" || s.Epoch != gb.Epoch {
		t.Fatalf("after a backward jump: %s, want still held by b at epoch %d", stateString(s), gb.Epoch)
	}
	leftBefore, leftAfter := before.ExpiresAt.Sub(before.ServerNow), s.ExpiresAt.Sub(s.ServerNow)
	if leftAfter < 25*time.Second {
		t.Errorf("b's grant has %v left after jumping back 30 s, want about 32 s", leftAfter)
	}
	denied("c", "k")
	gb2, err := cl["b"].Renew(ctx, gb.Token, 2*time.Second)
	if err != nil || gb2.Epoch != gb.Epoch {
		t.Fatalf("b's renew after the backward jump: %v %v", gb2.Token, err)
	}
	rowRenew, _ := rawRow(t, admin, "k")
	mustRelease(t, cl["b"], gb2)
	rowRel, _ := rawRow(t, admin, "k")
	gc := grant("c", "k", 2*time.Second)
	rowC, _ := rawRow(t, admin, "k")
	if rowC.AcquiredAt.Before(rowRel.ExpiresAt) {
		t.Errorf("c's grant began at %s, before b's release at %s in server time", rowC.AcquiredAt, rowRel.ExpiresAt)
	}
	if !rowC.AcquiredAt.Before(rowB.AcquiredAt) {
		t.Errorf("c's acquired_at %s is not before b's %s: did the clock go back?", rowC.AcquiredAt, rowB.AcquiredAt)
	}
	t.Logf("CLOCK backward -30s: b's 2s grant had %v left before, %v after (held %v longer in real time); c denied meanwhile; "+
		"b's renew moved expires_at by %v; after b's release c got epoch %d (> %d) with acquired_at %v earlier than b's",
		leftBefore.Round(time.Millisecond), leftAfter.Round(time.Millisecond), (leftAfter - leftBefore).Round(time.Millisecond),
		rowRenew.ExpiresAt.Sub(gb.ExpiresAt).Round(time.Millisecond), gc.Epoch, gb.Epoch,
		rowB.AcquiredAt.Sub(rowC.AcquiredAt).Round(time.Millisecond))

	// Backward jump of 10 s (offset -20 s -> -30 s) after grants lapsed:
	// k2 lapsed and was not taken over; k3 lapsed (f), was taken over (g)
	// and lapsed again.
	gd := grant("d", "k2", time.Second)
	gf := grant("f", "k3", 300*time.Millisecond)
	pgtest.WaitLapsed(t, obs, "k3", 30*time.Second)
	gg := grant("g", "k3", 300*time.Millisecond)
	pgtest.WaitLapsed(t, obs, "k3", 30*time.Second)
	lapsedK2 := pgtest.WaitLapsed(t, obs, "k2", 30*time.Second)
	sinceExpiry := lapsedK2.ServerNow.Sub(gd.ExpiresAt)
	setOffset(-30 * time.Second)
	s2 := inspect(t, obs, "k2")
	if !s2.Held || s2.Owner != "d" || s2.Epoch != gd.Epoch {
		t.Errorf("k2 after jumping back past its expiry: %s (observed: want held again by d at epoch %d)", stateString(s2), gd.Epoch)
	}
	if g, err := cl["d"].Renew(ctx, gd.Token, time.Second); err != nil || g.Epoch != gd.Epoch {
		t.Errorf("d's renew of the revived grant: %v %v", g.Token, err)
	}
	denied("e", "k2")
	s3 := inspect(t, obs, "k3")
	if s3.Held && (s3.Owner != "g" || s3.Epoch != gg.Epoch) {
		t.Errorf("k3 after the jump: %s, want held by g (epoch %d) or free", stateString(s3), gg.Epoch)
	}
	if _, err := cl["f"].Renew(ctx, gf.Token, time.Second); !errors.Is(err, lease.ErrLapsed) {
		t.Errorf("f's renew of k3 (taken over by g) after the jump: %v, want lapsed", err)
	}
	denied("f", "k3")
	t.Logf("CLOCK backward -10s after expiry: k2 (d, epoch %d, lapsed %v before the jump, not taken over) reads as held again and d's renew succeeds; "+
		"k3 (f lapsed, g took over at epoch %d, lapsed): held=%t owner=%q after the jump, f told lapsed",
		gd.Epoch, sinceExpiry.Round(time.Millisecond), gg.Epoch, s3.Held, s3.Owner)
	t.Logf("CLOCK epochs granted: %v", granted)
}

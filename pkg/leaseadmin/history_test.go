package leaseadmin_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// History and Health carry the server's answers unchanged: the kinds, who,
// the epochs, the reasons, the time without a holder before a grant, and
// per key the counters and the period's transitions and gaps. Both
// install modes.
func TestHistoryAndHealth(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		g1, ok, err := c.Acquire(ctx, "h", "a", 100*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("Acquire: %v %v", ok, err)
		}
		// b waits on the server until a's grant lapses: a takeover.
		g2, err := c.AcquireWait(ctx, "h", "b", time.Minute, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, g2.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "h"); err != nil {
			t.Fatal(err)
		}
		evs, err := leaseadmin.History(ctx, c, "h", 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 3 {
			t.Fatalf("History: %d events, want 3 (a forced release of a free key records nothing): %+v", len(evs), evs)
		}
		a, tk, rel := evs[0], evs[1], evs[2]
		if a.Kind != leaseadmin.HistoryAcquired || a.Seq != 1 || a.Owner != "a" || a.Epoch != g1.Epoch ||
			a.TTL != 100*time.Millisecond || !a.VacantSince.IsZero() || a.Role == "" || a.Actor != a.Role {
			t.Errorf("first grant: %+v", a)
		}
		if tk.Kind != leaseadmin.HistoryTakenOver || tk.Owner != "b" || tk.Epoch != g2.Epoch || tk.PreviousOwner != "a" ||
			tk.PreviousEpoch != g1.Epoch || tk.VacantSince.IsZero() || tk.VacantSince.After(tk.At) || tk.TTL != time.Minute {
			t.Errorf("takeover: %+v", tk)
		}
		// a's grant lapsed at its expiry: the gap before b's grant begins there.
		if got := tk.VacantSince.Sub(a.At); got < 100*time.Millisecond || got > 200*time.Millisecond {
			t.Errorf("takeover's vacancy began %v after a's grant, want its 100ms ttl", got)
		}
		if rel.Kind != leaseadmin.HistoryReleased || rel.Owner != "b" || rel.Epoch != g2.Epoch || rel.Seq != 3 {
			t.Errorf("release: %+v", rel)
		}
		last, err := leaseadmin.History(ctx, c, "h", 1)
		if err != nil || len(last) != 1 || last[0].Seq != 3 {
			t.Errorf("History(limit 1): %+v %v", last, err)
		}
		if evs, err := leaseadmin.History(ctx, c, "never", 10); err != nil || len(evs) != 0 {
			t.Errorf("History of a never-leased key: %+v %v", evs, err)
		}
		for _, n := range []int{0, 10001} {
			if _, err := leaseadmin.History(ctx, c, "h", n); !errors.Is(err, lease.ErrInvalidInput) {
				t.Errorf("History(limit %d): %v, want ErrInvalidInput", n, err)
			}
		}
		if _, err := leaseadmin.History(ctx, c, "", 10); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("History of an empty key: %v, want ErrInvalidInput", err)
		}

		if _, _, err := c.Acquire(ctx, "other", "x", time.Minute); err != nil {
			t.Fatal(err)
		}
		hs, err := leaseadmin.Health(ctx, c, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 2 || hs[0].Key != "h" || hs[1].Key != "other" {
			t.Fatalf("Health: %+v", hs)
		}
		h, o := hs[0], hs[1]
		if h.Held || h.Owner != "" || h.VacantSince.IsZero() || h.Vacant <= 0 || !h.HasHistory || h.Grants != 2 ||
			h.Transitions != 2 || h.TTL != time.Minute || !h.HistorySince.Equal(a.At) || h.Period != time.Hour {
			t.Errorf("Health of h: %+v", h)
		}
		// Without a holder: the lapse before the takeover, and since the release.
		if want := tk.At.Sub(tk.VacantSince) + h.ServerNow.Sub(h.VacantSince); h.Leaderless < want-time.Millisecond || h.Leaderless > want+time.Millisecond {
			t.Errorf("Health of h: leaderless %v, want %v", h.Leaderless, want)
		}
		if !o.Held || o.Owner != "x" || o.Role == "" || o.TermStarted.IsZero() || o.TermAge < 0 || o.Vacant != 0 ||
			o.Grants != 1 || o.Transitions != 1 || o.Leaderless != 0 {
			t.Errorf("Health of other: %+v", o)
		}
		for _, p := range []time.Duration{0, time.Millisecond, 367 * 24 * time.Hour} {
			if _, err := leaseadmin.Health(ctx, c, p); !errors.Is(err, lease.ErrInvalidInput) {
				t.Errorf("Health(%v): %v, want ErrInvalidInput", p, err)
			}
		}
	})
}

// Clean-up removes a key's history with the key; when the key comes back,
// its history starts again (and its grants counter with it).
func TestCleanupRemovesHistory(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewLeasePool(t)
	c := lease.New(pool)
	g, ok, err := c.Acquire(ctx, "gone", "a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	if removed, _, err := leaseadmin.Cleanup(ctx, c, 0, 10); err != nil || removed != 1 {
		t.Fatalf("Cleanup: %d %v", removed, err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM lease.history").Scan(&n); err != nil || n != 0 {
		t.Fatalf("history rows after clean-up: %d %v", n, err)
	}
	if _, ok, err := c.Acquire(ctx, "gone", "b", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	evs, err := leaseadmin.History(ctx, c, "gone", 10)
	if err != nil || len(evs) != 1 || evs[0].Seq != 1 || evs[0].Owner != "b" {
		t.Fatalf("history of the key after it came back: %+v %v", evs, err)
	}
}

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

// History and Health across database roles: a role reads another role's
// events and grants without their role names (Role and Actor empty), its
// own with them; and another role's 51 grant and release cycles of a free
// key (102 events, more than the 100 kept) leave the first role's events
// of that key in place, the other role keeping its own last 100.
func TestHistoryAcrossRoles(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		aliceRole, aliceDSN := pgtest.NewRole(t, db.dsn, "regress_pglease_alice")
		eveRole, eveDSN := pgtest.NewRole(t, db.dsn, "regress_pglease_eve")
		alice := lease.New(newPool(t, aliceDSN))
		eve := lease.New(newPool(t, eveDSN))

		g, _, err := alice.Acquire(ctx, "k", "alice", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := alice.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, err := alice.Acquire(ctx, "held", "alice", time.Minute); err != nil {
			t.Fatal(err)
		}
		for range 51 {
			g, ok, err := eve.Acquire(ctx, "k", "eve", time.Minute)
			if err != nil || !ok {
				t.Fatalf("eve's acquire: %v %v", ok, err)
			}
			if err := eve.Release(ctx, g.Token); err != nil {
				t.Fatal(err)
			}
		}
		byOwner := func(c *lease.Client, who string) (own, others []leaseadmin.HistoryEvent) {
			t.Helper()
			h, err := leaseadmin.History(ctx, c, "k", 10000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range h {
				if e.Owner == who {
					own = append(own, e)
				} else {
					others = append(others, e)
				}
			}
			return own, others
		}
		own, others := byOwner(alice, "alice")
		if len(own) != 2 || own[0].Kind != leaseadmin.HistoryAcquired || own[1].Kind != leaseadmin.HistoryReleased {
			t.Fatalf("alice's events after eve's 51 cycles: %+v, want her acquired and released", own)
		}
		for _, e := range own {
			if e.Role != aliceRole || e.Actor != aliceRole {
				t.Errorf("alice reads her own event %d with role %q, actor %q", e.Seq, e.Role, e.Actor)
			}
		}
		if len(others) != 100 {
			t.Errorf("alice reads %d of eve's events, want the 100 kept", len(others))
		}
		for _, e := range others {
			if e.Role != "" || e.Actor != "" {
				t.Fatalf("alice reads eve's event %d with role %q, actor %q, want none", e.Seq, e.Role, e.Actor)
			}
		}
		own, others = byOwner(eve, "eve")
		if len(own) != 100 || own[0].Role != eveRole || len(others) != 2 || others[0].Role != "" || others[0].Actor != "" {
			t.Fatalf("eve's view: %d own (first %+v), alice's %+v", len(own), own[0], others)
		}
		for _, c := range []struct {
			c    *lease.Client
			role string
		}{{alice, aliceRole}, {eve, ""}} {
			hs, err := leaseadmin.Health(ctx, c.c, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				if h.Key == "held" && (!h.Held || h.Owner != "alice" || h.Role != c.role) {
					t.Errorf("Health of held: %+v, want alice's grant with role %q", h, c.role)
				}
			}
		}
	})
}

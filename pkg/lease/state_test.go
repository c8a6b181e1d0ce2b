package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestStateSaysWhyAKeyIsNotHeld: Inspect and List tell a lapsed grant (with
// its holder and expiry) from a release, for every key or for named keys,
// and the two agree.
func TestStateSaysWhyAKeyIsNotHeld(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		held, _, err := c.Acquire(ctx, "st-held", "o-held", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rel, _, err := c.Acquire(ctx, "st-released", "o-rel", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, rel.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Acquire(ctx, "st-forced", "o-forced", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "st-forced"); err != nil {
			t.Fatal(err)
		}
		lapsed, _, err := c.Acquire(ctx, "st-lapsed", "o-lapsed", 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.WaitServerPast(t, db.pool, lapsed.ExpiresAt)

		check := func(how string, s lease.State) {
			t.Helper()
			var ok bool
			switch s.Key {
			case "st-held":
				ok = s.Held && !s.Lapsed && !s.Released && s.Owner == "o-held" && s.LastOwner == "o-held" &&
					s.Since.Equal(s.AcquiredAt) && !s.AcquiredAt.IsZero() && s.ExpiresAt.Equal(held.ExpiresAt) &&
					s.Since.Before(held.ExpiresAt)
			case "st-lapsed":
				ok = !s.Held && s.Lapsed && !s.Released && s.Owner == "" && s.LastOwner == "o-lapsed" &&
					s.Since.Equal(lapsed.ExpiresAt) && s.ExpiresAt.IsZero() && s.AcquiredAt.IsZero()
			case "st-released":
				ok = !s.Held && !s.Lapsed && s.Released && s.LastOwner == "" && s.Epoch == 2 &&
					s.Since.After(rel.ExpiresAt.Add(-time.Minute)) && !s.Since.After(s.ServerNow)
			case "st-forced":
				ok = !s.Held && !s.Lapsed && s.Released && s.LastOwner == "" && s.Epoch == 2 && !s.Since.IsZero()
			}
			if !ok || !s.Exists {
				t.Errorf("%s %s: %+v", how, s.Key, s)
			}
		}
		keys := []string{"st-released", "st-never", "st-lapsed", "st-held", "st-forced", "st-held"}
		byKey := map[string]lease.State{}
		for _, k := range keys {
			s, err := c.Inspect(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if k == "st-never" {
				if s.Exists || s.Lapsed || s.Released {
					t.Errorf("Inspect of a key never leased: %+v", s)
				}
				continue
			}
			check("Inspect", s)
			byKey[k] = s
		}
		some, err := c.List(ctx, keys...)
		if err != nil {
			t.Fatal(err)
		}
		if len(some) != 4 || some[0].Key != "st-forced" || some[1].Key != "st-held" ||
			some[2].Key != "st-lapsed" || some[3].Key != "st-released" {
			t.Fatalf("List(keys): %+v, want the four leased keys once each, in key order", some)
		}
		all, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 4 {
			t.Fatalf("List(): %+v", all)
		}
		for i, s := range some {
			check("List(keys)", s)
			check("List()", all[i])
			in := byKey[s.Key]
			if s.Held != in.Held || s.Lapsed != in.Lapsed || s.Released != in.Released || s.LastOwner != in.LastOwner ||
				!s.Since.Equal(in.Since) || !s.AcquiredAt.Equal(in.AcquiredAt) || s.Epoch != in.Epoch {
				t.Errorf("List and Inspect differ: %+v, %+v", s, in)
			}
		}
		// The held grant's expiry on the local clock, from either read.
		if some[1].ExpiresLocal().IsZero() || byKey["st-held"].ExpiresLocal().IsZero() {
			t.Errorf("no ExpiresLocal for the held key")
		}
	})
}

// TestListRefusesBadKeys: a bad key is the server's invalid_input, as for
// Inspect.
func TestListRefusesBadKeys(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	for _, keys := range [][]string{{""}, {"ok", "a\tb"}, {string(make([]byte, 1025))}} {
		if _, err := db.c.List(ctx, keys...); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("List(%q): %v, want ErrInvalidInput", keys, err)
		}
	}
}

// TestStateOnAnOlderServer: before pg_lease 0.4.0 the server does not say
// why a key is not held. Inspect and List still read it, and List picks
// named keys out of the whole list.
func TestStateOnAnOlderServer(t *testing.T) {
	pgtest.SharedExtensionFiles(t)
	ctx := testCtx(t)
	conn := connect(t, pgtest.NewDatabase(t))
	if _, err := conn.Exec(ctx, `CREATE EXTENSION pg_lease VERSION '0.3.0'`); err != nil {
		t.Fatal(err)
	}
	c := lease.New(conn)
	if _, _, err := c.Acquire(ctx, "old-held", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	g, _, err := c.Acquire(ctx, "old-released", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	s, err := c.Inspect(ctx, "old-released")
	if err != nil || !s.Exists || s.Held || s.Lapsed || s.Released || s.LastOwner != "" || !s.Since.IsZero() {
		t.Fatalf("Inspect on 0.3.0: %+v, %v", s, err)
	}
	some, err := c.List(ctx, "old-held", "never")
	if err != nil || len(some) != 1 || !some[0].Held || some[0].Owner != "o" || some[0].ExpiresLocal().IsZero() {
		t.Fatalf("List(keys) on 0.3.0: %+v, %v", some, err)
	}
}

package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// TestAcquireReleaseOwned: AcquireOwned and ReleaseOwned (lease.acquire_many
// and lease.release_many) answer in input order as AcquireMany and
// ReleaseMany do; on a server without those functions they fall back to
// them; a batch of two owners or a repeated key is refused before a round
// trip.
func TestAcquireReleaseOwned(t *testing.T) {
	for _, older := range []bool{false, true} {
		db := newDB(t, installModes[0])
		ctx := testCtx(t)
		c := db.c
		if older {
			if _, err := db.pool.Exec(ctx, `ALTER EXTENSION pg_lease DROP FUNCTION lease.acquire_many(text[], text, interval);
ALTER EXTENSION pg_lease DROP FUNCTION lease.release_many(text[], text, bigint[]);
DROP FUNCTION lease.acquire_many(text[], text, interval);
DROP FUNCTION lease.release_many(text[], text, bigint[])`); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := c.Acquire(ctx, "m-other", "o2", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		keys := []string{"m-2", "m-other", "m-1"}
		grants, errs, err := c.AcquireOwned(ctx, keys, "o1", 30*time.Second)
		if err != nil {
			t.Fatalf("older %v: %v", older, err)
		}
		for i, k := range keys {
			if errs[i] != nil {
				t.Errorf("older %v: %s: %v", older, k, errs[i])
			}
			if want := k != "m-other"; (grants[i].Epoch == 1) != want || (want && grants[i].Key != k) {
				t.Errorf("older %v: %s: grant %+v", older, k, grants[i])
			}
		}
		again, _, err := c.AcquireOwned(ctx, []string{"m-1"}, "o1", 30*time.Second)
		if err != nil || again[0].Token != grants[2].Token {
			t.Errorf("older %v: idempotent acquire: %+v %v", older, again, err)
		}
		ts := []lease.Token{grants[2].Token, {Key: "m-other", Owner: "o1", Epoch: 1}, grants[0].Token}
		rerrs, err := c.ReleaseOwned(ctx, ts)
		if err != nil {
			t.Fatalf("older %v: %v", older, err)
		}
		if rerrs[0] != nil || rerrs[2] != nil || !errors.Is(rerrs[1], lease.ErrNotOwner) {
			t.Errorf("older %v: release answers %v", older, rerrs)
		}
		for _, k := range []string{"m-1", "m-2"} {
			st, err := c.Inspect(ctx, k)
			if err != nil || st.Held || st.Epoch != 2 {
				t.Errorf("older %v: %s after the release: %+v %v", older, k, st, err)
			}
		}
		if st, _ := c.Inspect(ctx, "m-other"); !st.Held || st.Owner != "o2" {
			t.Errorf("older %v: another owner's key: %+v", older, st)
		}
	}
	c := newDB(t, installModes[0]).c
	ctx := testCtx(t)
	for _, ts := range [][]lease.Token{
		{{Key: "a", Owner: "o1", Epoch: 1}, {Key: "b", Owner: "o2", Epoch: 1}},
		{{Key: "a", Owner: "o1", Epoch: 1}, {Key: "a", Owner: "o1", Epoch: 2}},
	} {
		if _, err := c.ReleaseOwned(ctx, ts); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("%v: %v, want ErrInvalidInput", ts, err)
		}
	}
	if _, _, err := c.AcquireOwned(ctx, []string{"a", ""}, "o1", time.Second); !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("an empty key: %v, want ErrInvalidInput", err)
	}
}

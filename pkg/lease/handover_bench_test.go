package lease_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// BenchmarkReleaseHandover times a release that frees its key beside one
// that hands it to a registered candidate (strategy priority, two ready
// candidates passing the key back and forth), in the same run on the same
// database, and the candidates' ranking (lease._ranked: the liveness check
// of each registration's backend and role) alone. ns/op is per release;
// p50-µs and p99-µs are of the release calls only.
func BenchmarkReleaseHandover(b *testing.B) {
	db := newDB(b, installModes[0])
	ctx := testCtx(b)
	timed := func(b *testing.B, f func() time.Duration) {
		var ds []float64
		for b.Loop() {
			ds = append(ds, float64(f().Microseconds()))
		}
		sort.Float64s(ds)
		b.ReportMetric(ds[len(ds)/2], "p50-µs")
		b.ReportMetric(ds[len(ds)*99/100], "p99-µs")
	}
	release := func(b *testing.B, t lease.Token) time.Duration {
		start := time.Now()
		if err := db.c.Release(ctx, t); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	b.Run("free", func(b *testing.B) {
		timed(b, func() time.Duration {
			g, ok, err := db.c.Acquire(ctx, "free", "a", time.Hour)
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			return release(b, g.Token)
		})
	})
	b.Run("handover", func(b *testing.B) {
		if _, err := handover.SetStrategy(ctx, db.c, "handed", handover.StrategyPriority); err != nil {
			b.Fatal(err)
		}
		register := func(owner string) {
			if _, err := handover.Register(ctx, db.c, "handed", handover.Candidate{Owner: owner, Ready: true, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
		register("a")
		register("b")
		g, ok, err := db.c.Acquire(ctx, "handed", "a", time.Hour)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		t := g.Token
		timed(b, func() time.Duration {
			d := release(b, t)
			st, err := db.c.Inspect(ctx, "handed")
			if err != nil || !st.Held || st.Owner == t.Owner {
				b.Fatalf("after the release of %v: %+v, %v (want a handover)", t, st, err)
			}
			t = lease.Token{Key: "handed", Owner: st.Owner, Epoch: st.Epoch}
			return d
		})
	})
	b.Run("ranking", func(b *testing.B) {
		timed(b, func() time.Duration {
			start := time.Now()
			var n int
			if err := db.pool.QueryRow(context.Background(), `SELECT count(*) FROM lease._ranked('handed', now())`).Scan(&n); err != nil || n != 2 {
				b.Fatal(n, err)
			}
			return time.Since(start)
		})
	})
	b.Run("select1", func(b *testing.B) {
		timed(b, func() time.Duration {
			start := time.Now()
			var n int
			if err := db.pool.QueryRow(context.Background(), `SELECT 1`).Scan(&n); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		})
	})
}

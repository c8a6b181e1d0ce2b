package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// BenchmarkRenewMany renews n grants of one owner, as n Renew calls
// ("single") and as one RenewMany ("batch"), in the same run on the same
// database. ns/op is for all n; renewals/s is the throughput.
func BenchmarkRenewMany(b *testing.B) {
	db := newDB(b, installModes[0])
	ctx := testCtx(b)
	for _, n := range []int{1, 10, 100, 1000} {
		ts := make([]lease.Token, n)
		for i := range ts {
			g, ok, err := db.c.Acquire(ctx, fmt.Sprintf("bench-%d-%d", n, i), "o1", time.Hour)
			if err != nil || !ok {
				b.Fatalf("acquire: %v %v", ok, err)
			}
			ts[i] = g.Token
		}
		b.Run(fmt.Sprintf("single/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, t := range ts {
					if _, err := db.c.Renew(ctx, t, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "renewals/s")
		})
		b.Run(fmt.Sprintf("batch/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				res, err := db.c.RenewMany(ctx, ts, time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "renewals/s")
		})
	}
}

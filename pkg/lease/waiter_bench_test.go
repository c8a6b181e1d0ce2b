package lease_test

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

var a2Trials = flag.Int("a2.trials", 50, "BenchmarkA2: minimum number of trials per path")

// BenchmarkA2 measures A2, the waiter's detection latency, on the shared
// test server (or PGLEASE_TEST_DSN), with the default fallback poll (1 s),
// so that only the notification or the expiry timer can explain a fast
// grant:
//
//   - release: from the releaser's Release returning (its COMMIT done) to the
//     waiting goroutine's Acquire returning with the grant. It can be
//     negative: the notification may reach the waiter before the commit's
//     reply reaches the releaser.
//   - expiry: from the holder's server expiry, converted to the local clock
//     through a measured offset, to the waiting goroutine's Acquire
//     returning. expiry-server is the same on the server's clock alone: the
//     new grant's start minus the old grant's expiry.
//
// ns/op is meaningless here and suppressed; run it with -benchtime 1x:
//
//	go test ./pkg/lease -run '^$' -bench BenchmarkA2 -benchtime 1x [-a2.trials 200]
func BenchmarkA2(b *testing.B) {
	db := newDB(b, installModes[0])
	ctx := testCtx(b)
	holderConn := connect(b, db.dsn)
	holder := lease.New(holderConn)
	w, rec := newWaiter(b, db, lease.WaiterOptions{})

	report := func(b *testing.B, name string, s []time.Duration) {
		slices.Sort(s)
		q := func(p float64) float64 {
			i := int(p*float64(len(s)-1) + 0.5)
			return float64(s[i].Microseconds()) / 1000
		}
		b.ReportMetric(q(0.50), name+"-p50-ms")
		b.ReportMetric(q(0.99), name+"-p99-ms")
		b.ReportMetric(float64(s[len(s)-1].Microseconds())/1000, name+"-max-ms")
	}
	wait := func(b *testing.B, key, owner string) <-chan acquired {
		ch := make(chan acquired, 1)
		go func() {
			g, err := w.Acquire(ctx, key, owner, time.Minute)
			ch <- acquired{g: g, err: err, at: time.Now()}
		}()
		rec.next(b, "denied", key)
		return ch
	}
	get := func(b *testing.B, ch <-chan acquired) acquired {
		r := <-ch
		if r.err != nil {
			b.Fatal(r.err)
		}
		return r
	}
	trials := func(b *testing.B) int { return max(b.N, *a2Trials) }

	b.Run("release", func(b *testing.B) {
		var lat []time.Duration
		for i := range trials(b) {
			key := fmt.Sprintf("a2/release/%d/%d", b.N, i)
			h, ok, err := holder.Acquire(ctx, key, "holder", time.Hour)
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			res := wait(b, key, "waiter")
			if err := holder.Release(ctx, h.Token); err != nil {
				b.Fatal(err)
			}
			committed := time.Now()
			r := get(b, res)
			lat = append(lat, r.at.Sub(committed))
		}
		b.ReportMetric(0, "ns/op")
		report(b, "release", lat)
	})

	b.Run("expiry", func(b *testing.B) {
		var lat, srv []time.Duration
		const ttl = 60 * time.Millisecond
		before := w.Stats()
		n := trials(b)
		for i := range n {
			key := fmt.Sprintf("a2/expiry/%d/%d", b.N, i)
			off, err := lease.MeasureClockOffset(ctx, holderConn, 3)
			if err != nil {
				b.Fatal(err)
			}
			h, ok, err := holder.Acquire(ctx, key, "holder", ttl)
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			res := wait(b, key, "waiter")
			r := get(b, res)
			lat = append(lat, r.at.Sub(off.ToLocal(h.ExpiresAt)))
			srv = append(srv, r.g.ExpiresAt.Add(-r.g.TTL).Sub(h.ExpiresAt))
		}
		b.ReportMetric(0, "ns/op")
		after := w.Stats()
		b.ReportMetric(float64(after.Attempts-before.Attempts)/float64(n), "expiry-attempts/trial")
		report(b, "expiry", lat)
		report(b, "expiry-server", srv)
	})
}

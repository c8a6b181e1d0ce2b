package listen_test

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

var a2Trials = flag.Int("a2.trials", 50, "BenchmarkA2: minimum number of trials per path")

// BenchmarkA2 measures A2, the detection latency of Await (the one wake
// policy), on the shared test server (or PGLEASE_TEST_DSN), with the poll
// far out, so that only the notification or the expiry timer can explain a
// fast wake:
//
//   - release: from the releaser's Release returning (its COMMIT done) to a
//     waiting goroutine's Await returning and its Acquire holding the key.
//     It can be negative: the notification may reach the waiter before the
//     commit's reply reaches the releaser.
//   - expiry-server: on the server's clock alone, the new grant's start
//     minus the old grant's expiry.
//
// ns/op is meaningless here and suppressed; run it with -benchtime 1x:
//
//	go test ./pkg/listen -run '^$' -bench BenchmarkA2 -benchtime 1x [-a2.trials 200]
func BenchmarkA2(b *testing.B) {
	db := newDB(b, installModes[0])
	ctx := testCtx(b)
	holder := lease.New(connect(b, db.dsn))
	w, _ := newWaiter(b, db, listen.Options{})

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
	type took struct {
		g  lease.Grant
		at time.Time
	}
	take := func(b *testing.B, key string) <-chan took {
		c, reads := watched(db)
		ch := make(chan took, 1)
		go func() {
			_, err := listen.Await(ctx, w, c, key, time.Hour, func(s lease.State) bool { return !s.Held })
			if err != nil {
				b.Error(err)
			}
			g, ok, err := c.Acquire(ctx, key, "waiter", time.Minute)
			if err != nil || !ok {
				b.Error(ok, err)
			}
			ch <- took{g, time.Now()}
		}()
		<-reads
		return ch
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
			res := take(b, key)
			if err := holder.Release(ctx, h.Token); err != nil {
				b.Fatal(err)
			}
			committed := time.Now()
			r := <-res
			lat = append(lat, r.at.Sub(committed))
		}
		b.ReportMetric(0, "ns/op")
		report(b, "release", lat)
	})

	b.Run("expiry", func(b *testing.B) {
		var srv []time.Duration
		const ttl = 60 * time.Millisecond
		for i := range trials(b) {
			key := fmt.Sprintf("a2/expiry/%d/%d", b.N, i)
			h, ok, err := holder.Acquire(ctx, key, "holder", ttl)
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			r := <-take(b, key)
			srv = append(srv, r.g.ExpiresAt.Add(-r.g.TTL).Sub(h.ExpiresAt))
		}
		b.ReportMetric(0, "ns/op")
		report(b, "expiry-server", srv)
	})
}

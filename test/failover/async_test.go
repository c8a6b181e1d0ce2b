package failover

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestAsyncPromotionNeverReissuesEpochs: a primary with an asynchronous
// standby, clients acquiring, renewing, releasing and letting lapse a few
// keys through a multi-host DSN (target_session_attrs=read-write). The
// standby is cut off mid-workload, so grants and releases made after that
// are never replayed; the primary is killed, the standby promoted, and the
// clients reach it through the same DSN and go on. Over the whole history no
// (key, epoch) is granted to two owners and per key the epochs strictly
// increase in real-time order.
func TestAsyncPromotionNeverReissuesEpochs(t *testing.T) {
	const maxTTL = 2 * time.Second
	c, p, st := newPair(t, maxTTL)
	ctx := pgtest.Context(t, 3*time.Minute)
	multi := pgtest.MultiHostDSN(dbName, p, st)

	var h history
	stop := make(chan struct{})
	var wg sync.WaitGroup
	keys := []string{"a", "b"}
	var errMu sync.Mutex
	errs := map[string]int{}
	for i := range 4 {
		owner := fmt.Sprintf("c%d", i)
		cl := lease.New(pool(t, multi))
		r := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[r.IntN(len(keys))]
				cctx, cancel := opCtx(3 * time.Second)
				inv := time.Now()
				g, ok, err := cl.Acquire(cctx, key, owner, time.Second)
				resp := time.Now()
				if err == nil && ok {
					h.Add(grantRec{key: key, owner: owner, epoch: g.Epoch, inv: inv, resp: resp})
					switch r.IntN(3) {
					case 0: // renew, then release
						if _, err := cl.Renew(cctx, g.Token, time.Second); err == nil {
							_ = cl.Release(cctx, g.Token)
						}
					case 1:
						_ = cl.Release(cctx, g.Token)
					default: // let it lapse
					}
				}
				if err != nil {
					errMu.Lock()
					errs[fmt.Sprintf("%T", err)]++
					errMu.Unlock()
				}
				cancel()
				time.Sleep(time.Duration(5+r.IntN(20)) * time.Millisecond)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	time.Sleep(1500 * time.Millisecond)
	if err := st.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	time.Sleep(time.Second)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// Past the grace and then some.
	time.Sleep(maxTTL + 3*time.Second)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	gs := h.All()
	var lost, after int
	var first time.Time
	for _, g := range gs {
		if g.resp.After(cut) && g.resp.Before(killed) {
			lost++
		}
		if g.inv.After(killed) {
			after++
			if first.IsZero() || g.resp.Before(first) {
				first = g.resp
			}
		}
	}
	t.Logf("%d grants; %d acknowledged by the old primary after the standby was cut off (never replayed); %d after the kill; errors by type %v",
		len(gs), lost, after, errs)
	if lost == 0 {
		t.Fatal("no grant between the cut and the kill: the test did not exercise an unreplayed tail")
	}
	if after == 0 {
		t.Fatalf("no grant within %v after the promotion", maxTTL+3*time.Second)
	}
	t.Logf("promotion (pg_ctl promote -w) took %v after the kill; first grant on the new primary %v after the promotion (max_ttl %v)",
		promoted.Sub(killed).Round(time.Millisecond), first.Sub(promoted).Round(time.Millisecond), c.maxTTL)
	report(t, checkGrants(gs))
}

package failover

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/internal/robustness"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// term is one candidate's leadership under one epoch, on this process's
// monotonic clock: from the callback's start to the observed end of its
// token context.
type term struct {
	who        string
	epoch      int64
	start, end time.Time
}

type terms struct {
	mu    sync.Mutex
	list  []*term
	begun chan *term
}

func (r *terms) begin(who string, epoch int64) *term {
	tr := &term{who: who, epoch: epoch, start: time.Now()}
	r.mu.Lock()
	r.list = append(r.list, tr)
	r.mu.Unlock()
	select {
	case r.begun <- tr:
	default:
	}
	return tr
}

func (r *terms) end(tr *term) {
	at := time.Now()
	r.mu.Lock()
	tr.end = at
	r.mu.Unlock()
}

// current is the term in progress (nil if none).
func (r *terms) current() *term {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.list) - 1; i >= 0; i-- {
		if r.list[i].end.IsZero() {
			return r.list[i]
		}
	}
	return nil
}

// overlaps reports every pair of terms that overlap on the monotonic clock
// (a term not ended overlaps everything after its start).
func (r *terms) overlaps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := append([]*term(nil), r.list...)
	sort.Slice(l, func(i, j int) bool { return l[i].start.Before(l[j].start) })
	var v []string
	for i, a := range l {
		for _, b := range l[i+1:] {
			if a.end.IsZero() || b.start.Before(a.end) {
				end := "never"
				if !a.end.IsZero() {
					end = a.end.Sub(b.start).Round(time.Millisecond).String() + " after"
				}
				v = append(v, fmt.Sprintf("%s (epoch %d) led until %s %s (epoch %d) started", a.who, a.epoch, end, b.who, b.epoch))
			}
		}
	}
	return v
}

// candidate is one campaigning process (here: goroutine) whose connections
// to the primary and the standby go through proxies of its own, so that it
// can be partitioned off.
type candidate struct {
	who     string
	proxies []*robustness.Proxy
}

func (c *candidate) partition() {
	for _, p := range c.proxies {
		p.Blackhole()
		p.Cut()
	}
}

func newCandidate(t *testing.T, who string, servers ...*pgtest.Server) (*candidate, string) {
	t.Helper()
	c := &candidate{who: who}
	hosts, ports := "", ""
	for i, s := range servers {
		p, err := robustness.NewProxy(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		c.proxies = append(c.proxies, p)
		if i > 0 {
			hosts, ports = hosts+",", ports+","
		}
		hosts += "127.0.0.1"
		ports += strconv.Itoa(p.Port())
	}
	return c, fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2",
		hosts, ports, pgtest.Superuser, dbName)
}

// TestElectorsThroughFailover: three candidates on a multi-host DSN
// (target_session_attrs=read-write) listing the primary and its
// asynchronous standby. The standby is cut off while the leader renews (its
// renewals are lost), the leader is partitioned off (its network dies with
// the primary), the primary is killed and the standby promoted; a fourth
// candidate joins once the replayed grant has expired there. One leader
// at a time on this process's monotonic clock, over the whole run; a new
// leader within the bound: the old grant's TTL (until a grant path sees the
// new timeline), then the promotion grace (max_ttl), plus 5 s for retries,
// reconnects and a loaded machine.
func TestElectorsThroughFailover(t *testing.T) {
	const ttl = 2 * time.Second
	for _, kind := range []string{"elector", "client-go"} {
		t.Run(kind, func(t *testing.T) {
			c, p, st := newPair(t, ttl)
			ctx := pgtest.Context(t, 3*time.Minute)
			rec := &terms{begun: make(chan *term, 100)}
			runCtx, stopAll := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { stopAll(); wg.Wait() }()
			var candMu sync.Mutex
			cands := map[string]*candidate{}
			start := func(i int) {
				who := fmt.Sprintf("%s-%d", kind, i)
				cand, cdsn := newCandidate(t, who, p, st)
				candMu.Lock()
				cands[who] = cand
				candMu.Unlock()
				client := lease.New(pool(t, cdsn))
				switch kind {
				case "elector":
					el, err := elector.New(client, elector.Config{Key: "leader", Identity: who, TTL: ttl,
						Callbacks: elector.Callbacks{OnStartedLeading: func(lctx context.Context) {
							tok, _ := lease.TokenFromContext(lctx)
							tr := rec.begin(who, tok.Epoch)
							<-lctx.Done()
							rec.end(tr)
						}}})
					if err != nil {
						t.Fatal(err)
					}
					wg.Go(func() { _ = el.Run(runCtx) })
				case "client-go":
					lock, err := resourcelock.New(client, resourcelock.Config{Key: "leader", Identity: who, LeaseDuration: ttl})
					if err != nil {
						t.Fatal(err)
					}
					cfg := leaderelection.LeaderElectionConfig{
						Lock: lock, Name: "leader", LeaseDuration: ttl, RenewDeadline: 1500 * time.Millisecond,
						RetryPeriod: 300 * time.Millisecond, ReleaseOnCancel: true,
						Callbacks: leaderelection.LeaderCallbacks{
							OnStartedLeading: func(lctx context.Context) {
								for lctx.Err() == nil {
									tctx, cancel, err := lock.TokenContext(lctx)
									if err != nil { // between epochs
										time.Sleep(20 * time.Millisecond)
										continue
									}
									tok, _ := lease.TokenFromContext(tctx)
									tr := rec.begin(who, tok.Epoch)
									<-tctx.Done()
									rec.end(tr)
									cancel()
								}
							},
							OnStoppedLeading: func() {},
						},
					}
					wg.Go(func() {
						for runCtx.Err() == nil {
							le, err := leaderelection.NewLeaderElector(cfg)
							if err != nil {
								t.Error(err)
								return
							}
							le.Run(runCtx)
						}
					})
				}
			}
			for i := range 3 {
				start(i)
			}
			var first *term
			select {
			case first = <-rec.begun:
			case <-ctx.Done():
				t.Fatal("no leader")
			}
			cutOff(t, ctx, p, st)
			// The leader renews (lost with the primary) for most of a TTL: its
			// belief outlasts the replayed grant by that much.
			time.Sleep(ttl - 300*time.Millisecond)
			old := rec.current()
			if old == nil {
				t.Fatalf("no term in progress a second after the cut (first: %s epoch %d)", first.who, first.epoch)
			}
			candMu.Lock()
			cands[old.who].partition()
			candMu.Unlock()
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := st.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			promoted := time.Now()
			// A candidate joins once the replayed grant has expired on the
			// promoted server (a restarted process: it has observed nothing,
			// and a client-go follower that saw a holder waits a whole
			// LeaseDuration from then, this one does not).
			s, err := lease.New(pgtest.Connect(t, dsn(st))).Inspect(ctx, "leader")
			if err != nil {
				t.Fatal(err)
			}
			if s.Held {
				time.Sleep(time.Until(s.ExpiresAt.Add(50 * time.Millisecond)))
			}
			start(3)
			bound := ttl + c.maxTTL + 5*time.Second
			var next *term
			for next == nil {
				select {
				case tr := <-rec.begun:
					if tr.who != old.who {
						next = tr
					}
				case <-time.After(time.Until(promoted.Add(bound))):
					t.Fatalf("no new leader within %v of the promotion (old leader %s, epoch %d)", bound, old.who, old.epoch)
				}
			}
			t.Logf("old leader %s (epoch %d) partitioned; new leader %s (epoch %d) %v after the promotion (bound %v)",
				old.who, old.epoch, next.who, next.epoch, next.start.Sub(promoted).Round(time.Millisecond), bound)
			time.Sleep(time.Second) // a little leadership on the new primary
			stopAll()
			candMu.Lock()
			defer candMu.Unlock()
			for _, cand := range cands {
				for _, px := range cand.proxies {
					px.Open()
					px.Cut()
				}
			}
			wg.Wait()
			report(t, rec.overlaps())
		})
	}
}

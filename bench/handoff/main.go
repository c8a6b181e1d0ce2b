// Command handoff measures leader handoff and takeover latency, same machine,
// same run, for three electors:
//
//	elector        pkg/elector (with a listen.Waiter) over pg_lease
//	clientgo-pg    client-go's leaderelection with pkg/resourcelock's Lock
//	               (Config.Waiter: a follower's Get waits for news; timings
//	               checked by Lock.LeaderElectionConfig)
//	clientgo-k8s   client-go's leaderelection with its LeaseLock on a real
//	               kube-apiserver + etcd (envtest, binaries from
//	               hack/build-control-plane.sh, as test/e2e does)
//	elector-cold, clientgo-pg-cold
//	               the same two with pools that do not warm their connections
//	               (no lease.WarmConn): what the warm-up saves, in the same run
//	elector-handover, clientgo-pg-handover
//	               the same two with every follower a registered candidate
//	               (handover.Candidacy, strategy priority): the leader's release
//	               grants the key to the follower in its own transaction
//	baseline       the physical limit of a handoff, measured the same way: a
//	               durable one-row UPDATE that sends a NOTIFY, a listener on
//	               another connection that wakes on it, and a second durable
//	               UPDATE on a third connection (two durable commits and one
//	               notification round trip)
//
// in two timing profiles:
//
//	fast       TTL (LeaseDuration) 1 s, client-go RenewDeadline 700 ms,
//	           RetryPeriod 100 ms: handoff and takeover trials;
//	defaults   controller-runtime's defaults, 15 s / 10 s / 2 s: handoff
//	           trials (a takeover there is LeaseDuration plus a retry
//	           whatever the backend; the fast profile measures it scaled).
//
// A trial starts candidate A, waits until it leads, starts candidate B,
// waits until B has observed A as leader and then 2.2 RetryPeriods more (B
// is a standby that has been running, past client-go's first jittered
// retry), then:
//
//	handoff   cancels A's context (a graceful resignation: A releases) and
//	          times until B's OnStartedLeading is called;
//	takeover  crashes A, after a random delay of up to TTL/2 (its connections
//	          fail from that instant, nothing is released), and times until
//	          B's OnStartedLeading is called.
//
// For the pg_lease electors, takeover trials also record the detection
// latency on the server's clock: the new grant's acquired_at minus the
// crashed grant's final expires_at.
//
// Each pg_lease handoff is also traced (-trace, default on): every query of
// both candidates (a pgx tracer on their pools) and the successor's receipt
// of the notification (a Watch on its Waiter) are timed from the cancel, so
// that the stage table says where each millisecond of the median handoff
// goes and how many round trips each side made.
//
// Results: handoff.json, handoff.md and handoff.svg (ECDFs) in -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	k8slock "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	pgrl "github.com/pglease/pg_lease/pkg/resourcelock"
)

var (
	out           = flag.String("out", "bench/results/handoff", "results folder")
	trials        = flag.Int("trials", 60, "trials per scenario and elector, fast profile")
	defaultTrials = flag.Int("default-trials", 20, "handoff trials per elector, defaults profile")
	systemsF      = flag.String("systems", "baseline,elector,elector-handover,clientgo-pg,clientgo-pg-handover,clientgo-k8s", "electors to measure (also elector-cold, clientgo-pg-cold: pools without lease.WarmConn)")
	traceF        = flag.Bool("trace", true, "trace each pg_lease handoff's queries and notification (stage table)")
	profilesF     = flag.String("profiles", "fast,defaults", "timing profiles to run (fast, defaults)")
	// client-go timings of the fast profile, scaled from its defaults (15 s / 10 s / 2 s) to a 1 s lease.
	renewDeadline = flag.Duration("renew-deadline", 700*time.Millisecond, "client-go RenewDeadline, fast profile")
	retryPeriod   = flag.Duration("retry-period", 100*time.Millisecond, "client-go RetryPeriod, fast profile")
)

// profile is one set of timings: the lease TTL (client-go's LeaseDuration)
// and client-go's RenewDeadline and RetryPeriod.
type profile struct {
	name                            string
	ttl, renewDeadline, retryPeriod time.Duration
	scenarios                       []string
	trials                          int
}

// candidate is one running election participant.
type candidate struct {
	id       string
	led      chan time.Time // OnStartedLeading calls
	observed chan struct{}  // closed when another leader was observed
	done     chan struct{}  // closed when Run returned
	cancel   context.CancelFunc
	crash    func()         // from now on every call of this candidate fails
	waiter   *listen.Waiter // nil for the API server
	trace    *tracer        // nil for the API server
	gets     *atomic.Int64  // client-go over pg_lease: Get calls begun
}

func newCandidate(id string) *candidate {
	return &candidate{id: id, led: make(chan time.Time, 4), observed: make(chan struct{}), done: make(chan struct{})}
}

func (c *candidate) observe(identity string) {
	if identity != "" && identity != c.id {
		select {
		case <-c.observed:
		default:
			close(c.observed)
		}
	}
}

type system struct {
	name  string
	start func(ctx context.Context, p profile, id string) (*candidate, error)
	// pg: the key's row, to read server times; nil for the API server.
	pg  *pgxpool.Pool
	key string
	// baseline: the physical limit, measured in place of an election.
	baseline *baseline
}

// candidacy is the handover systems' handover.Candidacy (nil for the others):
// every follower is a ready candidate and the key's strategy is priority.
func candidacy(system string) *handover.Candidacy {
	if !strings.HasSuffix(system, "-handover") {
		return nil
	}
	return &handover.Candidacy{Strategy: handover.StrategyPriority}
}

type trialResult struct {
	Profile  string  `json:"profile"`
	System   string  `json:"system"`
	Scenario string  `json:"scenario"`
	Ms       float64 `json:"ms"`
	DetectMs float64 `json:"detect_ms,omitempty"` // takeover, pg: acquired_at - crashed expires_at (server clock)
	// Stages: traced pg_lease handoffs, ms from the cancel (see stageNames).
	Stages map[string]float64 `json:"stages_ms,omitempty"`
	// LeaderCalls, SuccessorCalls: queries of the old leader from the cancel
	// to its release's answer, and of the successor from the notification
	// to OnStartedLeading.
	LeaderCalls    []string `json:"leader_calls,omitempty"`
	SuccessorCalls []string `json:"successor_calls,omitempty"`
	// How: the history event that began the successor's term (handed_over
	// for a handover, acquired for a grant after a release).
	How  string  `json:"how,omitempty"`
	Load float64 `json:"load1"`
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	klog.SetLogger(logr.Discard())
	// SIGINT/SIGTERM end the trials early; the servers are still stopped.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	s, err := benchutil.StartServer(ctx, map[string]string{"max_connections": "100"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	dsn, err := benchutil.CreateDB(ctx, s, "handoff")
	if err != nil {
		log.Fatal(err)
	}
	si, err := benchutil.ReadServerInfo(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	obs, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer obs.Close()

	var systems []*system
	for _, name := range strings.Split(*systemsF, ",") {
		switch name {
		case "baseline":
			b, err := newBaseline(ctx, dsn)
			if err != nil {
				log.Fatalf("baseline: %v", err)
			}
			defer b.close()
			systems = append(systems, &system{name: name, baseline: b})
		case "elector", "elector-cold", "elector-handover":
			warm := name != "elector-cold"
			systems = append(systems, &system{name: name, start: electorCandidate(dsn, "bench-"+name, warm, candidacy(name)), pg: obs, key: "bench-" + name})
		case "clientgo-pg", "clientgo-pg-cold", "clientgo-pg-handover":
			warm := name != "clientgo-pg-cold"
			systems = append(systems, &system{name: name, start: clientgoPGCandidate(dsn, "bench-"+name, warm, candidacy(name)), pg: obs, key: "bench-" + name})
		case "clientgo-k8s":
			cfg, stop, err := startControlPlane()
			if err != nil {
				log.Fatalf("control plane: %v", err)
			}
			defer stop()
			systems = append(systems, &system{name: name, start: clientgoK8sCandidate(cfg)})
		default:
			log.Fatalf("unknown system %q", name)
		}
	}

	var profiles []profile
	for _, name := range strings.Split(*profilesF, ",") {
		switch name {
		case "fast":
			profiles = append(profiles, profile{name: name, ttl: time.Second, renewDeadline: *renewDeadline, retryPeriod: *retryPeriod,
				scenarios: []string{"handoff", "takeover"}, trials: *trials})
		case "defaults":
			profiles = append(profiles, profile{name: name, ttl: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second,
				scenarios: []string{"handoff"}, trials: *defaultTrials})
		default:
			log.Fatalf("unknown profile %q", name)
		}
	}

	type summary struct {
		Profile  string          `json:"profile"`
		System   string          `json:"system"`
		Scenario string          `json:"scenario"`
		Stats    benchutil.Stats `json:"stats_ms"`
		Detect   benchutil.Stats `json:"detect_stats_ms,omitempty"`
		Failures int             `json:"failures"`
	}
	var (
		results []trialResult
		sums    []summary
		md      strings.Builder
		panels  []benchutil.Panel
	)
	for _, p := range profiles {
		failures := map[string]int{}
		for i := 0; i < p.trials && ctx.Err() == nil; i++ {
			for _, scenario := range p.scenarios {
				for _, sys := range systems {
					if sys.baseline != nil && scenario != "handoff" {
						continue
					}
					r, err := trial(ctx, sys, p, scenario, i)
					if err != nil {
						failures[sys.name+"/"+scenario]++
						log.Printf("%s %s %s trial %d: %v", p.name, sys.name, scenario, i, err)
						continue
					}
					results = append(results, r)
				}
			}
			if i%10 == 0 {
				log.Printf("%s: trial %d/%d done (load %.2f)", p.name, i+1, p.trials, benchutil.LoadAvg())
			}
		}

		fmt.Fprintf(&md, "\n### %s: TTL (LeaseDuration) %v, client-go RenewDeadline %v, RetryPeriod %v\n\n", p.name, p.ttl, p.renewDeadline, p.retryPeriod)
		fmt.Fprintf(&md, "| elector | scenario | trials | p50 ms | p95 ms | p99 ms | max ms | server-side detection p50 / p99 ms |\n|---|---|---|---|---|---|---|---|\n")
		handoffP50 := map[string]float64{}
		for _, scenario := range p.scenarios {
			panel := benchutil.Panel{Title: fmt.Sprintf("%s, %s (TTL %v, RP %v)", scenario, p.name, p.ttl, p.retryPeriod),
				Marks: map[string]float64{"20 ms": 20}}
			if scenario == "takeover" {
				ttlMs := float64(p.ttl.Milliseconds())
				panel.Marks = map[string]float64{"TTL": ttlMs, "TTL+50 ms": ttlMs + 50}
			}
			for _, sys := range systems {
				if sys.baseline != nil && scenario != "handoff" {
					continue
				}
				var ms, det []float64
				for _, r := range results {
					if r.Profile == p.name && r.System == sys.name && r.Scenario == scenario {
						ms = append(ms, r.Ms)
						if r.Scenario == "takeover" && sys.pg != nil {
							det = append(det, r.DetectMs)
						}
					}
				}
				vals := append([]float64(nil), ms...)
				st := benchutil.Summarize(ms)
				dt := benchutil.Summarize(det)
				if scenario == "handoff" {
					handoffP50[sys.name] = st.P50
				}
				sums = append(sums, summary{Profile: p.name, System: sys.name, Scenario: scenario, Stats: st, Detect: dt, Failures: failures[sys.name+"/"+scenario]})
				d := "–"
				if dt.N > 0 {
					d = fmt.Sprintf("%.1f / %.1f", dt.P50, dt.P99)
				}
				fmt.Fprintf(&md, "| %s | %s | %d (%d failed) | %.1f | %.1f | %.1f | %.1f | %s |\n", sys.name, scenario, st.N, failures[sys.name+"/"+scenario],
					st.P50, st.P95, st.P99, st.Max, d)
				panel.Series = append(panel.Series, benchutil.Series{Name: sys.name, Values: vals})
			}
			panels = append(panels, panel)
		}
		if k, pg := handoffP50["clientgo-k8s"], handoffP50["clientgo-pg"]; k > 0 && pg > 0 {
			fmt.Fprintf(&md, "\nHandoff p50, client-go's Lease lock / client-go + pkg/resourcelock: %.0f×\n", k/pg)
		}
		if b := handoffP50["baseline"]; b > 0 {
			fmt.Fprintf(&md, "\nHandoff p50 / the baseline's p50 (%.2f ms):", b)
			for _, sys := range systems {
				if v := handoffP50[sys.name]; v > 0 && sys.baseline == nil {
					fmt.Fprintf(&md, " %s %.1f×;", sys.name, v/b)
				}
			}
			fmt.Fprintln(&md)
		}
		writeStages(&md, p.name, systems, results)
		var loads []float64
		for _, r := range results {
			if r.Profile == p.name {
				loads = append(loads, r.Load)
			}
		}
		if ls := benchutil.Summarize(loads); ls.N > 0 {
			fmt.Fprintf(&md, "\nLoad average (1 min) at the trials: min %.2f, median %.2f, max %.2f\n", loads[0], ls.P50, ls.Max)
		}
	}
	fmt.Print(md.String())
	if err := benchutil.WriteJSON(*out, "handoff.json", map[string]any{"server": si, "profiles": profiles,
		"summary": sums, "trials": results}); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "handoff.md"), []byte(md.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	svg := benchutil.ECDFSVG(fmt.Sprintf("Leader handoff and takeover latency (%s)", time.Now().UTC().Format("2006-01-02")), panels)
	if err := os.WriteFile(filepath.Join(*out, "handoff.svg"), []byte(svg), 0o644); err != nil {
		log.Fatal(err)
	}
}

func wait[T any](ch <-chan T, d time.Duration, what string) (T, error) {
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-time.After(d):
		return zero, fmt.Errorf("timed out after %v waiting for %s", d, what)
	}
}

func waitClosed(ch <-chan struct{}, d time.Duration, what string) error {
	select {
	case <-ch:
		return nil
	case <-time.After(d):
		return fmt.Errorf("timed out after %v waiting for %s", d, what)
	}
}

func trial(ctx context.Context, sys *system, p profile, scenario string, i int) (trialResult, error) {
	r := trialResult{Profile: p.name, System: sys.name, Scenario: scenario, Load: benchutil.LoadAvg()}
	if sys.baseline != nil {
		d, err := sys.baseline.once(ctx)
		r.Ms = float64(d) / float64(time.Millisecond)
		return r, err
	}
	ttl := p.ttl
	a, err := sys.start(ctx, p, fmt.Sprintf("%s-%s-a-%s-%d", p.name, sys.name, scenario, i))
	if err != nil {
		return r, err
	}
	defer func() { a.cancel(); <-a.done }()
	if _, err := wait(a.led, 10*time.Second+ttl, "A to lead"); err != nil {
		return r, err
	}
	b, err := sys.start(ctx, p, fmt.Sprintf("%s-%s-b-%s-%d", p.name, sys.name, scenario, i))
	if err != nil {
		return r, err
	}
	defer func() { b.cancel(); <-b.done }()
	// A client-go candidate (a Lock with a Candidacy) waits from its first
	// Get while A holds the key, so it reports no leader before the
	// handoff: it is settled once the server holds its ready registration.
	// Every other B first observes A.
	candidateGet := sys.pg != nil && b.gets != nil && candidacy(sys.name) != nil
	if candidateGet {
		if err := awaitCandidate(ctx, sys, b.id, 10*time.Second); err != nil {
			return r, err
		}
	} else if err := waitClosed(b.observed, 10*time.Second, "B to observe A"); err != nil {
		return r, err
	}
	// B settles into its steady state: past client-go's first jittered
	// retry after it observed A (pkg/elector is waiting at once).
	// wait.JitterUntil sleeps RetryPeriod × (1 + rand × JitterFactor). Over
	// pg_lease, B is settled once its second Get began (it waits for news),
	// or its first for a candidate.
	settle := time.Duration((1+leaderelection.JitterFactor)*float64(p.retryPeriod)) + 50*time.Millisecond
	if strings.HasPrefix(sys.name, "elector") {
		settle = 50 * time.Millisecond
	} else if sys.pg != nil {
		want := int64(2)
		if candidateGet {
			want = 1
		}
		for end := time.Now().Add(settle); b.gets != nil && b.gets.Load() < want && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		settle = 50 * time.Millisecond
	}
	time.Sleep(settle)
	var t0 time.Time
	var crashedExpiry time.Time
	var notified chan time.Time
	if scenario == "handoff" {
		if *traceF && b.waiter != nil {
			notified = make(chan time.Time, 1)
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			evs := b.waiter.Watch(wctx, sys.key)
			go func() {
				for ev := range evs {
					if ev.Type == listen.EventReleased || ev.Type == listen.EventHandover || ev.Type == listen.EventForceReleased {
						notified <- ev.Received
						return
					}
				}
			}()
		}
		a.trace.reset()
		b.trace.reset()
		t0 = time.Now()
		a.cancel()
	} else {
		// Crash at a random phase of the holder's renewal cycle (pkg/elector
		// renews every TTL/3, client-go every RetryPeriod), so that
		// crash-to-grant spans its whole range: from TTL minus the renewal
		// interval (crash just before a renewal) to TTL plus the detection
		// latency (crash just after one).
		time.Sleep(time.Duration(rand.Int64N(int64(ttl / 2))))
		t0 = time.Now()
		a.crash()
		if sys.pg != nil {
			if err := sys.pg.QueryRow(ctx, `SELECT expires_at FROM lease.leases WHERE key = $1`, sys.key).Scan(&crashedExpiry); err != nil {
				return r, err
			}
		}
		a.cancel()
	}
	t1, err := wait(b.led, 5*ttl+5*time.Second, "B to lead")
	if err != nil {
		return r, err
	}
	r.Ms = float64(t1.Sub(t0)) / float64(time.Millisecond)
	if notified != nil {
		var tn time.Time
		select {
		case tn = <-notified:
		case <-time.After(time.Second):
		}
		r.Stages, r.LeaderCalls, r.SuccessorCalls = stages(t0, t1, tn, a.trace.spans(), b.trace.spans())
	}
	if scenario == "handoff" && sys.pg != nil {
		if err := sys.pg.QueryRow(ctx, `SELECT event FROM lease.history WHERE key = $1 ORDER BY seq DESC LIMIT 1`, sys.key).Scan(&r.How); err != nil {
			return r, err
		}
	}
	if scenario == "takeover" && sys.pg != nil {
		var acquired time.Time
		if err := sys.pg.QueryRow(ctx, `SELECT acquired_at FROM lease.leases WHERE key = $1`, sys.key).Scan(&acquired); err != nil {
			return r, err
		}
		r.DetectMs = float64(acquired.Sub(crashedExpiry)) / float64(time.Millisecond)
	}
	return r, nil
}

// awaitCandidate waits until the server holds a live, ready registration of
// owner as a candidate of sys's key.
func awaitCandidate(ctx context.Context, sys *system, owner string, within time.Duration) error {
	c := lease.New(sys.pg)
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		_, cands, err := handover.Candidates(ctx, c, sys.key)
		if err != nil {
			return err
		}
		for _, cs := range cands {
			if cs.Owner == owner && cs.Live && cs.Ready {
				return nil
			}
		}
	}
	return fmt.Errorf("timed out after %v waiting for %s to register as a candidate", within, owner)
}

// dial opens a candidate's pool and its one listener (a listen.Waiter) on dsn.
// warm: the pool warms each connection (lease.WarmConn, as the examples and
// pkg/leaderelection do); the "-cold" systems leave it out, to measure
// what it saves in the same run.
func dial(ctx context.Context, dsn string, warm bool, tr *tracer) (*pgxpool.Pool, *listen.Waiter, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	if warm {
		pcfg.AfterConnect = lease.WarmConn
	}
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, w, nil
}

// ---- pkg/elector ----

func electorCandidate(dsn, key string, warm bool, cand *handover.Candidacy) func(context.Context, profile, string) (*candidate, error) {
	return func(ctx context.Context, p profile, id string) (*candidate, error) {
		c := newCandidate(id)
		c.trace = &tracer{}
		pool, w, err := dial(ctx, dsn, warm, c.trace)
		if err != nil {
			return nil, err
		}
		c.waiter = w
		client := lease.New(pool)
		el, err := elector.New(client, elector.Config{
			Key: key, Identity: id, TTL: p.ttl,
			Waiter: w, Candidacy: cand,
			Callbacks: elector.Callbacks{
				OnStartedLeading: func(ctx context.Context) {
					c.led <- time.Now()
					<-ctx.Done()
				},
				OnNewLeader: func(identity string, _ int64) { c.observe(identity) },
			},
		})
		if err != nil {
			w.Close()
			pool.Close()
			return nil, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		c.cancel = cancel
		var crashed atomic.Bool
		c.crash = func() {
			crashed.Store(true)
			pool.Close() // waits for calls in flight; every later call fails
			w.Close()
		}
		go func() {
			defer close(c.done)
			_ = el.Run(runCtx)
			if !crashed.Load() {
				w.Close()
				pool.Close()
			}
		}()
		return c, nil
	}
}

// ---- client-go's elector over pkg/resourcelock ----

func clientgoPGCandidate(dsn, key string, warm bool, cand *handover.Candidacy) func(context.Context, profile, string) (*candidate, error) {
	return func(ctx context.Context, p profile, id string) (*candidate, error) {
		tr := &tracer{}
		pool, w, err := dial(ctx, dsn, warm, tr)
		if err != nil {
			return nil, err
		}
		closeAll := func() { w.Close(); pool.Close() }
		lock, err := pgrl.New(lease.New(pool), pgrl.Config{Key: key, Identity: id, LeaseDuration: p.ttl, Waiter: w, Candidacy: cand})
		if err != nil {
			closeAll()
			return nil, err
		}
		cfg, err := lock.LeaderElectionConfig(leaderelection.LeaderElectionConfig{
			LeaseDuration: p.ttl, RenewDeadline: p.renewDeadline, RetryPeriod: p.retryPeriod})
		if err != nil {
			closeAll()
			return nil, err
		}
		gets := new(atomic.Int64)
		cfg.Lock = &countingLock{Interface: cfg.Lock, gets: gets}
		c, err := runClientGo(ctx, id, cfg, closeAll, func() {})
		if err != nil {
			return nil, err
		}
		c.waiter, c.trace, c.gets = w, tr, gets
		return c, nil
	}
}

// countingLock counts the Get calls client-go makes (a follower's second
// Get is the one that waits for news), and passes every call on.
type countingLock struct {
	k8slock.Interface
	gets *atomic.Int64
}

func (l *countingLock) Get(ctx context.Context) (*k8slock.LeaderElectionRecord, []byte, error) {
	l.gets.Add(1)
	return l.Interface.Get(ctx)
}

// ---- client-go's elector over its LeaseLock on the API server ----

// crashTransport fails every request once crashed is set.
type crashTransport struct {
	rt      http.RoundTripper
	crashed *atomic.Bool
}

func (t crashTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.crashed.Load() {
		return nil, errors.New("crashed")
	}
	return t.rt.RoundTrip(req)
}

func clientgoK8sCandidate(base *rest.Config) func(context.Context, profile, string) (*candidate, error) {
	return func(ctx context.Context, p profile, id string) (*candidate, error) {
		cfg := rest.CopyConfig(base)
		cfg.QPS, cfg.Burst = 1000, 1000
		cfg.Timeout = 5 * time.Second
		var crashed atomic.Bool
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return crashTransport{rt: rt, crashed: &crashed} })
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		lock := &k8slock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: "default", Name: "bench-clientgo"},
			Client:     cs.CoordinationV1(),
			LockConfig: k8slock.ResourceLockConfig{Identity: id},
		}
		return runClientGo(ctx, id, leaderelection.LeaderElectionConfig{Lock: lock,
			LeaseDuration: p.ttl, RenewDeadline: p.renewDeadline, RetryPeriod: p.retryPeriod}, func() {}, func() { crashed.Store(true) })
	}
}

// runClientGo runs client-go's elector with cfg's Lock and timings.
func runClientGo(ctx context.Context, id string, cfg leaderelection.LeaderElectionConfig, closeFn, crashFn func()) (*candidate, error) {
	c := newCandidate(id)
	cfg.ReleaseOnCancel, cfg.Name = true, id
	cfg.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			c.led <- time.Now()
			<-ctx.Done()
		},
		OnStoppedLeading: func() {},
		OnNewLeader:      c.observe,
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		closeFn()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	var crashed atomic.Bool
	c.crash = func() { crashed.Store(true); crashFn(); closeFn() }
	go func() {
		defer close(c.done)
		le.Run(runCtx)
		if !crashed.Load() {
			closeFn()
		}
	}()
	return c, nil
}

// startControlPlane starts etcd + kube-apiserver through envtest from the
// binaries hack/build-control-plane.sh builds (cached), on loopback, the way
// test/e2e's StartControlPlane does (that helper lives in a _test.go file and
// cannot be imported).
func startControlPlane() (*rest.Config, func(), error) {
	outb, err := exec.Command("bash", "hack/build-control-plane.sh").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("hack/build-control-plane.sh (run from the repository root): %w", err)
	}
	dir := strings.TrimSpace(string(outb))
	logDir, err := os.MkdirTemp("", "pglease-bench-cp-")
	if err != nil {
		return nil, nil, err
	}
	logf, err := os.Create(filepath.Join(logDir, "controlplane.log"))
	if err != nil {
		return nil, nil, err
	}
	no := false
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir, UseExistingCluster: &no, DownloadBinaryAssets: false,
		ControlPlaneStartTimeout: 2 * time.Minute, ControlPlaneStopTimeout: time.Minute,
		ControlPlane: envtest.ControlPlane{
			Etcd:      &envtest.Etcd{Path: filepath.Join(dir, "etcd"), Out: logf, Err: logf},
			APIServer: &envtest.APIServer{Path: filepath.Join(dir, "kube-apiserver"), Out: logf, Err: logf},
		},
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, nil, err
	}
	if !strings.Contains(cfg.Host, "127.0.0.1") && !strings.Contains(cfg.Host, "localhost") {
		_ = env.Stop()
		return nil, nil, fmt.Errorf("control plane serves on %s, want loopback", cfg.Host)
	}
	log.Printf("control plane up at %s", cfg.Host)
	return cfg, func() {
		if err := env.Stop(); err != nil {
			log.Printf("stopping control plane: %v", err)
		}
		logf.Close()
		os.RemoveAll(logDir)
	}, nil
}

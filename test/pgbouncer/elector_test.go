package pgbouncer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/internal/testprog"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/client-go/tools/leaderelection"
)

// Timings of the election tests: a 2 s TTL, so that a takeover (the TTL)
// and a handoff (a release) are told apart at a glance.
const (
	ttl    = 2 * time.Second
	retry  = 200 * time.Millisecond
	trials = 3
)

// testElector: pkg/elector in candidate processes (with a Waiter) behind
// each pool mode. The leader stops (SIGTERM: it releases) and a follower
// leads; the leader dies (SIGKILL: the grant lapses) and a follower leads.
// Each trial's handoff and takeover is logged: in session pooling a handoff
// is a notification away, in transaction pooling a follower's poll
// (RetryInterval) away; a takeover is a TTL either way.
func testElector(t *testing.T, s *setup) {
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		c := newCluster(t)
		env := []string{"PGLEASE_TC_DSN=" + dsn, "PGLEASE_TC_KEY=elector-" + mode, "PGLEASE_TC_TTL=" + ttl.String(),
			fmt.Sprintf("PGLEASE_TC_RETRY=%v", retry), "PGLEASE_TC_WAITER=1", "PGLEASE_TC_DEADLINES=1"}
		n := 0
		spawn := func() { n++; c.start(fmt.Sprintf("%s-%d", mode, n), env...) }
		spawn()
		spawn()
		leader := c.awaitStarted(t, "", "the first leader")
		var handoffs, takeovers []time.Duration
		for i := range 2 * trials {
			time.Sleep(time.Second) // the followers have read the key and wait on it
			kill := i%2 == 1
			sig, what := syscall.SIGTERM, "handoff"
			if kill {
				sig, what = syscall.SIGKILL, "takeover"
			}
			at := c.signal(t, leader.ID, sig)
			next := c.awaitStarted(t, leader.ID, what)
			if next.Epoch <= leader.Epoch {
				t.Fatalf("%s: %s leads with epoch %d, not above %d", what, next.ID, next.Epoch, leader.Epoch)
			}
			d := time.Unix(0, next.Wall).Sub(at)
			if kill {
				takeovers = append(takeovers, d)
			} else {
				handoffs = append(handoffs, d)
			}
			leader = next
			spawn()
		}
		t.Logf("%s pooling, pkg/elector (TTL %v, RetryInterval %v, Waiter): handoff %s, takeover %s",
			mode, ttl, retry, summary(handoffs), summary(takeovers))
	})
}

// testClientGo: client-go's LeaderElector on pkg/resourcelock (with a
// Waiter) behind each pool mode; the leader steps down with
// ReleaseOnCancel (a handoff) or without it (the grant lapses: a takeover).
func testClientGo(t *testing.T, s *setup) {
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 5*time.Minute)
		w, err := listen.NewWaiter(ctx, connConfig(t, dsn), listen.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		key := "clientgo-" + mode
		admin := s.directClient(t)
		n := 0
		started := make(chan string, 10)
		type cand struct {
			id     string
			cancel context.CancelFunc
			done   chan struct{}
		}
		spawn := func(release bool) *cand {
			n++
			id := fmt.Sprintf("%s-%d", mode, n)
			// Each candidate's pool ends with it: in session pooling every
			// client connection holds a server connection of the bouncer's
			// pool (default_pool_size) for its whole life.
			pcfg, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			noCancelRequests(pcfg.ConnConfig)
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			l, err := resourcelock.New(lease.New(pool), resourcelock.Config{Key: key, Identity: id, LeaseDuration: ttl, Waiter: w})
			if err != nil {
				t.Fatal(err)
			}
			le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock: l, Name: key, LeaseDuration: ttl, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 300 * time.Millisecond,
				ReleaseOnCancel: release,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(context.Context) { started <- id },
					OnStoppedLeading: func() {},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			c := &cand{id: id, cancel: cancel, done: make(chan struct{})}
			go func() { defer close(c.done); defer pool.Close(); le.Run(cctx) }()
			t.Cleanup(func() { cancel(); <-c.done })
			return c
		}
		await := func(what string) string {
			select {
			case id := <-started:
				return id
			case <-time.After(time.Minute):
				t.Fatalf("no leader within a minute: %s", what)
			}
			return ""
		}
		cands := map[string]*cand{}
		var handoffs, takeovers []time.Duration
		for i := range 2 * trials {
			release := i%2 == 0
			for len(cands) < 2 {
				c := spawn(release)
				cands[c.id] = c
			}
			leader := await("a leader")
			time.Sleep(time.Second) // the follower has read the key and waits on it
			at := time.Now()
			cands[leader].cancel()
			<-cands[leader].done
			delete(cands, leader)
			next := await("the next leader")
			if next == leader {
				t.Fatalf("%s led again after it stopped", leader)
			}
			if release {
				handoffs = append(handoffs, time.Since(at))
			} else {
				takeovers = append(takeovers, time.Since(at))
			}
			// Every trial starts from a free key with fresh candidates (the
			// next trial's ReleaseOnCancel differs).
			for _, c := range cands {
				c.cancel()
				<-c.done
			}
			cands = map[string]*cand{}
			pgtest.Eventually(t, time.Minute, "the key free again", func() bool {
				st, err := admin.Inspect(ctx, key)
				return err == nil && !st.Held
			})
		}
		t.Logf("%s pooling, client-go + pkg/resourcelock (LeaseDuration %v, RetryPeriod 300ms, Waiter): handoff %s, takeover %s",
			mode, ttl, summary(handoffs), summary(takeovers))
	})
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var all []string
	for _, d := range ds {
		all = append(all, ms(d))
	}
	return fmt.Sprintf("median %s of %v", ms(s[len(s)/2]), all)
}

// cluster runs candidate processes (internal/testprog/candidate) and
// collects their events.
type cluster struct {
	t     *testing.T
	mu    sync.Mutex
	procs map[string]*exec.Cmd
	ch    chan testprog.Event
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, procs: map[string]*exec.Cmd{}, ch: make(chan testprog.Event, 10000)}
}

func (c *cluster) start(id string, env ...string) {
	t := c.t
	t.Helper()
	cmd := exec.Command(pgtest.BuildProgram(t, testprog.CandidatePkg))
	cmd.Env = append(os.Environ(), "PGLEASE_TC_ID="+id)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.procs[id] = cmd
	c.mu.Unlock()
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e testprog.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err == nil {
				c.ch <- e
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
}

// signal sends sig to candidate id and returns when it was sent.
func (c *cluster) signal(t *testing.T, id string, sig syscall.Signal) time.Time {
	t.Helper()
	c.mu.Lock()
	cmd := c.procs[id]
	c.mu.Unlock()
	at := time.Now()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return at
}

// awaitStarted returns the next "started" event of a candidate other than
// not.
func (c *cluster) awaitStarted(t *testing.T, not, what string) testprog.Event {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case e := <-c.ch:
			if e.Ev == "error" {
				t.Fatalf("candidate %s: %s", e.ID, e.Err)
			}
			if e.Ev == "started" && e.ID != not {
				return e
			}
		case <-timeout:
			t.Fatalf("no leader within a minute: %s", what)
		}
	}
}

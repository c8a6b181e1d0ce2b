package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/shard"
)

// The sharded example's run on the real kube-apiserver: its throughput with
// 1, 2 and 3 replicas, and the rebalances when a replica joins, leaves
// (SIGTERM) and crashes (SIGKILL). Each reconcile waits shardedWork, as a
// call to a slow external system: on this 2-core machine a CPU-bound
// reconciler could not run faster on 3 replicas than on 1.
const (
	shardedObjects = 300
	shardedShards  = 64
	shardedWork    = 50 * time.Millisecond
	shardedWorkers = 2
	shardedTTL     = 2 * time.Second
)

// shardedParams are one run's workload: objects, shards, the time each
// reconcile waits, concurrent reconciles per replica and the keys' TTL.
type shardedParams struct {
	objects, shards, workers int
	work, ttl                time.Duration
}

var shardedSmall = shardedParams{objects: shardedObjects, shards: shardedShards, workers: shardedWorkers,
	work: shardedWork, ttl: shardedTTL}

var (
	shardedOnce sync.Once
	shardedBin  string
	shardedErr  error
	shardedDir  string // removed by TestMain
)

func buildSharded(t *testing.T) string {
	t.Helper()
	shardedOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			shardedErr = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = "/usr/local/go/bin/go"
		}
		dir, err := os.MkdirTemp("", "pglease-e2e-sharded-")
		if err != nil {
			shardedErr = err
			return
		}
		shardedDir = dir
		bin := filepath.Join(dir, "sharded")
		cmd := exec.Command(goBin, "build", "-o", bin, "./examples/sharded")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			shardedErr = fmt.Errorf("go build ./examples/sharded: %w\n%s", err, out)
			return
		}
		shardedBin = bin
	})
	if shardedErr != nil {
		t.Fatal(shardedErr)
	}
	return shardedBin
}

// shEvent is one line of the sharded example's standard output.
type shEvent struct {
	Time     time.Time `json:"time"`
	Event    string    `json:"event"`
	ID       string    `json:"id"`
	Shard    *int      `json:"shard"`
	Epoch    int64     `json:"epoch"`
	Resource string    `json:"resource"`
}

type shRun struct {
	t          *testing.T
	p          shardedParams
	bin        string
	kubeconfig string
	leaseDSN   string
	storeDSN   string
	namespace  string
	leases     *lease.Client
	store      *pgxpool.Pool
	logDir     string
	labels     map[string]string // controller -> the run label of its objects

	mu       sync.Mutex
	events   []shEvent
	acquired map[acquiredKey]time.Time // the first "acquired" event of each grant
	procs    map[string]*exec.Cmd
	wg       sync.WaitGroup
}

// acquiredKey names one grant a replica acted under: its id, the shard
// and the epoch.
type acquiredKey struct {
	id    string
	shard int
	epoch int64
}

// labelOf is the run label of controller's objects: controller, unless
// labels maps it to another controller's.
func (r *shRun) labelOf(controller string) string {
	if l, ok := r.labels[controller]; ok {
		return l
	}
	return controller
}

// start runs replica id of controller; it reconciles the objects labelled
// run=labelOf(controller).
func (r *shRun) start(controller, id string) {
	t := r.t
	cmd := exec.Command(r.bin, "-kubeconfig", r.kubeconfig, "-controller", controller, "-id", id,
		"-selector", runLabel+"="+r.labelOf(controller),
		"-namespace", r.namespace, "-shards", fmt.Sprint(r.p.shards), "-ttl", r.p.ttl.String(),
		"-work", r.p.work.String(), "-workers", fmt.Sprint(r.p.workers))
	cmd.Env = append(os.Environ(), "PGLEASE_DSN="+r.leaseDSN, "PGLEASE_STORE_DSN="+r.storeDSN)
	errLog, err := os.Create(filepath.Join(r.logDir, id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errLog
	var evLog *os.File // the events too, when the logs are kept
	if os.Getenv("PGLEASE_SHARDED_LOGS") != "" {
		if evLog, err = os.Create(filepath.Join(r.logDir, id+".events")); err != nil {
			t.Fatal(err)
		}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.procs[id] = cmd
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if evLog != nil {
				_, _ = evLog.Write(append(sc.Bytes(), '\n'))
			}
			var ev shEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				r.mu.Lock()
				r.events = append(r.events, ev)
				if k := (acquiredKey{ev.ID, -1, ev.Epoch}); ev.Event == "acquired" && ev.Shard != nil {
					k.shard = *ev.Shard
					if _, seen := r.acquired[k]; !seen {
						r.acquired[k] = ev.Time
					}
				}
				r.mu.Unlock()
			}
		}
		_ = cmd.Wait()
		errLog.Close()
		if evLog != nil {
			evLog.Close()
		}
	}()
}

// stop signals id and waits for its exit.
func (r *shRun) stop(id string, sig syscall.Signal) time.Time {
	at, wait := r.signal(id, sig)
	wait()
	return at
}

// signal signals id and returns when, and a function that waits for its
// exit: a rebalance is measured while the process shuts down.
func (r *shRun) signal(id string, sig syscall.Signal) (time.Time, func()) {
	r.mu.Lock()
	cmd := r.procs[id]
	delete(r.procs, id)
	r.mu.Unlock()
	at := time.Now()
	_ = cmd.Process.Signal(sig)
	r.t.Logf("%s: %v at %s", id, sig, at.Format("15:04:05.000000"))
	done := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(done) }()
	return at, func() {
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			r.t.Errorf("%s did not exit within a minute of %v", id, sig)
		}
	}
}

func (r *shRun) stopAll() {
	r.mu.Lock()
	var ids []string
	for id := range r.procs {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.stop(id, syscall.SIGTERM)
	}
	r.wg.Wait()
}

// settled waits until the members are exactly live and own every shard as
// Balance says (the view's Assigned), sampling the unowned shards meanwhile; it returns when that
// was first seen and the shard-seconds spent unowned.
func (r *shRun) settled(controller string, live ...string) (time.Time, float64) {
	r.t.Helper()
	ctx := pgtest.Context(r.t, 0)
	deadline := time.Now().Add(time.Minute + 10*r.p.ttl)
	last := time.Now()
	unowned := 0.0
	for {
		v, err := shard.Read(ctx, r.leases, controller, r.p.shards)
		if err != nil {
			r.t.Fatal(err)
		}
		now := time.Now()
		ok := len(v.Members) == len(live)
		for _, s := range v.Shards {
			if !s.Owned() {
				unowned += now.Sub(last).Seconds()
			}
			ok = ok && s.Owned() && s.Member != "" && s.Member == s.Assigned
		}
		last = now
		if ok {
			r.t.Logf("%s settled on %v at %s", controller, live, now.Format("15:04:05.000000"))
			return now, unowned
		}
		if now.After(deadline) {
			r.t.Fatalf("%s not settled on %v: %+v", controller, live, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reconciled waits until the store has a result of every object written by
// one of writers, and returns when that was seen.
func (r *shRun) reconciled(writers ...string) time.Time {
	r.t.Helper()
	ctx := pgtest.Context(r.t, 0)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n int
		if err := r.store.QueryRow(ctx, `SELECT count(*) FROM sharded_results WHERE writer = ANY($1)`, writers).Scan(&n); err != nil && !strings.Contains(err.Error(), "does not exist") {
			r.t.Fatal(err)
		}
		if n == r.p.objects {
			return time.Now()
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d objects reconciled by %v", n, r.p.objects, writers)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// overlaps counts, per shard, reconciles of two replicas running at once
// (from begin to end, as each process reported them).
func (r *shRun) overlaps() int { return r.overlapsOf("") }

// overlapsOf is overlaps among the replicas whose ids begin with prefix
// (one controller's: shard numbers are per controller).
func (r *shRun) overlapsOf(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	type iv struct {
		id         string
		start, end time.Time
	}
	open := map[string]time.Time{} // id|resource|epoch -> begin
	byShard := map[int][]iv{}
	for _, ev := range r.events {
		if ev.Shard == nil || !strings.HasPrefix(ev.ID, prefix) {
			continue
		}
		k := fmt.Sprintf("%s|%s|%d", ev.ID, ev.Resource, ev.Epoch)
		switch ev.Event {
		case "begin":
			open[k] = ev.Time
		case "end":
			if b, ok := open[k]; ok {
				byShard[*ev.Shard] = append(byShard[*ev.Shard], iv{ev.ID, b, ev.Time})
				delete(open, k)
			}
		}
	}
	n := 0
	for s, ivs := range byShard {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].start.Before(ivs[i].end); j++ {
				if ivs[j].id != ivs[i].id {
					n++
					r.t.Errorf("shard %d: %s reconciled %v-%v while %s did from %v", s, ivs[i].id,
						ivs[i].start.Format("15:04:05.000"), ivs[i].end.Format("15:04:05.000"),
						ivs[j].id, ivs[j].start.Format("15:04:05.000"))
				}
			}
		}
	}
	return n
}

const runLabel = "pglease.example/run"

// relabel puts every object in the run of controller: one merge patch per
// object, 64 at a time, so that the objects reach the replicas faster than
// three replicas reconcile them (with get and update, 16 at a time, the
// updates alone took most of a three-replica run).
func relabel(t *testing.T, kube client.Client, namespace, controller string, objects int) {
	t.Helper()
	ctx := pgtest.Context(t, 10*time.Minute)
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, runLabel, controller)))
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range objects {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("obj-%03d", i)}}
			if err := kube.Patch(ctx, cm, patch); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// churn updates random objects until stop is closed, so that reconciles run
// during every rebalance.
func churn(t *testing.T, kube client.Client, namespace string, objects int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := pgtest.Context(t, 30*time.Minute)
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				cm := &corev1.ConfigMap{}
				key := client.ObjectKey{Namespace: namespace, Name: fmt.Sprintf("obj-%03d", rnd.IntN(objects))}
				if err := kube.Get(ctx, key, cm); err != nil {
					t.Error(err)
					return
				}
				cm.Data["n"] = fmt.Sprint(n)
				if err := kube.Update(ctx, cm); err != nil && !apierrors.IsConflict(err) {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return &wg
}

func TestShardedOperator(t *testing.T) {
	r, kube := newShRun(t, shardedSmall, "sharded")
	ctx := pgtest.Context(t, 20*time.Minute)
	for i := range shardedObjects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("obj-%03d", i), Namespace: r.namespace,
			Labels: map[string]string{runLabel: "none"}}, Data: map[string]string{"i": fmt.Sprint(i)}}
		if err := kube.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}

	// Throughput: R replicas of a fresh controller reconcile every object
	// from their start; the store is emptied between runs.
	elapsed := map[int]time.Duration{}
	for _, n := range []int{1, 2, 3} {
		if _, err := r.store.Exec(ctx, `TRUNCATE sharded_results, sharded_fence`); err != nil && !strings.Contains(err.Error(), "does not exist") {
			t.Fatal(err)
		}
		controller := fmt.Sprintf("tp-%d", n)
		var ids []string
		for i := range n {
			id := fmt.Sprintf("%s-r%d", controller, i)
			ids = append(ids, id)
			r.start(controller, id)
		}
		// Measured from the replicas settled on their shards to every
		// object reconciled: process start-up and cache sync are not in it.
		r.settled(controller, ids...)
		start := time.Now()
		relabel(t, kube, r.namespace, controller, r.p.objects)
		elapsed[n] = r.reconciled(ids...).Sub(start)
		r.stopAll()
	}

	// Rebalances on one controller: start two, a third joins, one leaves,
	// one crashes.
	const ctl = "rb"
	if _, err := r.store.Exec(ctx, `TRUNCATE sharded_results, sharded_fence`); err != nil {
		t.Fatal(err)
	}
	relabel(t, kube, r.namespace, ctl, r.p.objects)
	r.start(ctl, "a")
	r.start(ctl, "b")
	r.settled(ctl, "a", "b")
	stopChurn := make(chan struct{})
	churning := churn(t, kube, r.namespace, r.p.objects, stopChurn)
	r.start(ctl, "c")
	var joinedAt time.Time
	for joinedAt.IsZero() {
		v, err := shard.Read(ctx, r.leases, ctl, shardedShards)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Members) == 3 {
			// The joiner's member key was granted at: (acquired_at, on the
			// server's clock; the same machine's clock as ours).
			states, err := r.leases.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range states {
				if st.Key == shard.MemberKey(ctl, "c") && st.Held {
					joinedAt = st.AcquiredAt
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	at, u1 := r.settled(ctl, "a", "b", "c")
	join := at.Sub(joinedAt)
	left, exited := r.signal("b", syscall.SIGTERM)
	at, u2 := r.settled(ctl, "a", "c")
	leave := at.Sub(left)
	exited()
	crashed := r.stop("c", syscall.SIGKILL)
	at, u3 := r.settled(ctl, "a")
	crash := at.Sub(crashed)
	close(stopChurn)
	churning.Wait()
	r.stopAll()

	overlaps := r.overlaps()
	var stale int
	r.mu.Lock()
	for _, ev := range r.events {
		if ev.Event == "stale" {
			stale++
		}
	}
	r.mu.Unlock()
	for _, n := range []int{1, 2, 3} {
		line := fmt.Sprintf("shards: replicas=%d speedup=%.2f", n, elapsed[1].Seconds()/elapsed[n].Seconds())
		if n == 3 {
			line += fmt.Sprintf(" join=%d ms leave=%d ms crash=%d ms overlaps=%d orphan-seconds=%.3f",
				join.Milliseconds(), leave.Milliseconds(), crash.Milliseconds(), overlaps, u1+u2+u3)
		}
		var ids []string
		for i := range n {
			ids = append(ids, fmt.Sprintf("tp-%d-r%d", n, i))
		}
		var split []string
		for _, id := range ids {
			split = append(split, fmt.Sprint(countOf(shard.Assign(shardedShards, ids), id)))
		}
		t.Logf("%s (all %d objects in %v; shards per replica %s of %d, %v per reconcile, %d workers per replica, ttl %v)",
			line, shardedObjects, elapsed[n].Round(time.Millisecond), strings.Join(split, "/"), shardedShards,
			shardedWork, shardedWorkers, shardedTTL)
		fmt.Println(line)
	}
	// A reconcile cancelled with its shard can still have its write in
	// flight; the guard rejects it if the new owner wrote first.
	t.Logf("stale writes rejected by the store's guard: %d", stale)
	if overlaps != 0 {
		t.Errorf("%d overlapping reconciles of one shard by two replicas", overlaps)
	}
}

func countOf(owners []string, id string) int {
	n := 0
	for _, o := range owners {
		if o == id {
			n++
		}
	}
	return n
}

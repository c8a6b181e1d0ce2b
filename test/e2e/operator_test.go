package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pglease/pg_lease/internal/kubetest"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Timings of every operator in these tests: short, so that the suite stays
// quick, and in the proportions client-go requires (LeaseDuration >
// RenewDeadline > JitterFactor × RetryPeriod).
const ttl = 3 * time.Second

var (
	renewDeadline = ttl * 2 / 3  // 2s: client-go's proportions (what the lock fills for 0)
	retryPeriod   = ttl * 2 / 15 // 400ms
)

// takeoverBound bounds a takeover after the leader died: its grant runs out
// TTL after its last renewal at the latest, and a follower notices within
// two of client-go's jittered retries (one to see the last renewal, one
// after the expiry; each at most (1+JitterFactor)×RetryPeriod), plus 500ms
// of scheduling on a busy 2-core machine.
var takeoverBound = ttl + 2*time.Duration((1+leaderelection.JitterFactor)*float64(retryPeriod)) + 500*time.Millisecond

// restartDelay is how long the supervisor waits before starting an operator
// again after it exited (a Deployment's restart, without its back-off).
const restartDelay = 300 * time.Millisecond

const watchLabel = "pglease.example/watch"

var (
	operatorOnce sync.Once
	operatorDir  string
	operatorBin  string
	operatorErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := kubetest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if operatorDir != "" {
		os.RemoveAll(operatorDir)
	}
	if shardedDir != "" {
		os.RemoveAll(shardedDir)
	}
	os.Exit(code)
}

// buildOperator builds examples/operator once per test binary.
func buildOperator(t testing.TB) string {
	t.Helper()
	operatorOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			operatorErr = err
			return
		}
		if operatorDir, err = os.MkdirTemp("", "pglease-e2e-operator-"); err != nil {
			operatorErr = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = "/usr/local/go/bin/go"
		}
		bin := filepath.Join(operatorDir, "operator")
		cmd := exec.Command(goBin, "build", "-o", bin, "./examples/operator")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			operatorErr = fmt.Errorf("go build ./examples/operator: %w\n%s", err, out)
			return
		}
		operatorBin = bin
	})
	if operatorErr != nil {
		t.Fatal(operatorErr)
	}
	return operatorBin
}

// writeKubeconfig writes a kubeconfig file for cfg (the envtest admin).
func writeKubeconfig(t testing.TB, cfg *rest.Config) string { return kubetest.WriteKubeconfig(t, cfg) }

// harness is what every scenario shares: one control plane, one operator
// binary.
type harness struct {
	cfg        *rest.Config
	kube       client.Client
	bin        string
	kubeconfig string
	timings    *timings
}

func newHarness(t *testing.T) *harness {
	cfg := StartControlPlane(t)
	bin := buildOperator(t)
	kube, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{cfg: cfg, kube: kube, bin: bin, kubeconfig: writeKubeconfig(t, cfg), timings: &timings{}}
}

// env is one scenario's world: a throwaway PostgreSQL holding the lease
// database and the store, a namespace, three operator slots.
type env struct {
	t    *testing.T
	h    *harness
	ctx  context.Context
	lock string // pglease | lease
	name string // the lease key, Lease name and namespace

	pg                 *pgtest.Server
	leaseDSN, storeDSN string
	leases             *lease.Client // -lock=pglease
	store              *pgxpool.Pool

	// dsnFor returns the lease and store DSNs an operator slot connects
	// with (through a proxy in scenario f).
	dsnFor func(slot int) (leaseDSN, storeDSN string)

	// ld, rd, rp override the operators' timings (ttl, renewDeadline,
	// retryPeriod) when set.
	ld, rd, rp time.Duration
	// args are more flags for every operator of the scenario.
	args []string
	// extraArgs, when set, returns more flags for the operator of one slot.
	extraArgs func(slot int) []string

	mu       sync.Mutex
	events   []opEvent
	procs    []*opProc
	current  map[int]*opProc
	gens     map[int]int
	samples  pgtest.Log[sample]
	stopping bool
	wg       sync.WaitGroup
	logDir   string
}

func (h *harness) newEnv(t *testing.T, lock, name string) *env {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, h: h, ctx: ctx, lock: lock, name: name, current: map[int]*opProc{}, gens: map[int]int{},
		logDir: t.TempDir()}
	e.pg = pgtest.New(t)
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	var err error
	if lock == "pglease" {
		if err := e.pg.InstallExtensionFiles(sctx); err != nil {
			t.Fatal(err)
		}
		if e.leaseDSN, err = e.pg.CreateDatabase(sctx, "leases"); err != nil {
			t.Fatal(err)
		}
		pool := newPool(t, e.leaseDSN)
		if err := leaseadmin.InstallExtension(sctx, pool); err != nil {
			t.Fatal(err)
		}
		// One server without standbys, configured as its operator would:
		// a restart (scenario (d)) moves the epoch base with no grace (in
		// the default mode 'any', no new leader for max_ttl after it).
		if _, err := pool.Exec(sctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
			t.Fatal(err)
		}
		e.leases = lease.New(pool)
	}
	if e.storeDSN, err = e.pg.CreateDatabase(sctx, "store"); err != nil {
		t.Fatal(err)
	}
	e.store = newPool(t, e.storeDSN)
	e.dsnFor = func(int) (string, string) { return e.leaseDSN, e.storeDSN }
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := h.kube.Create(sctx, ns); err != nil {
		t.Fatal(err)
	}
	// Stop every operator before the server and the pools go (cleanups run
	// last registered first).
	t.Cleanup(e.stopAll)
	e.wg.Add(1)
	go e.sample()
	return e
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// opEvent is one line of an operator's standard output (see
// examples/operator).
type opEvent struct {
	Time     time.Time `json:"time"`
	Event    string    `json:"event"`
	ID       string    `json:"id"`
	PID      int       `json:"pid"`
	Epoch    int64     `json:"epoch"`
	Resource string    `json:"resource"`
	RV       string    `json:"rv"`
	Highest  int64     `json:"highest"`
	Code     *int      `json:"code"`
	Error    string    `json:"error"`
}

func (ev opEvent) String() string {
	s := fmt.Sprintf("%s %s %s", ev.Time.Format("15:04:05.000"), ev.ID, ev.Event)
	if ev.Epoch != 0 {
		s += fmt.Sprintf(" epoch=%d", ev.Epoch)
	}
	if ev.Resource != "" {
		s += fmt.Sprintf(" %s@%s", ev.Resource, ev.RV)
	}
	if ev.Highest != 0 {
		s += fmt.Sprintf(" highest=%d", ev.Highest)
	}
	if ev.Code != nil {
		s += fmt.Sprintf(" code=%d", *ev.Code)
	}
	if ev.Error != "" {
		s += " error=" + ev.Error
	}
	return s
}

// opProc is one operator process.
type opProc struct {
	slot  int
	id    string
	cmd   *exec.Cmd
	probe string // host:port of /healthz and /readyz
	log   string // its standard error

	exited   chan struct{}
	exitAt   time.Time
	exitCode int
	// signals the test sent it, in order.
	signals []sentSignal
}

type sentSignal struct {
	sig syscall.Signal
	at  time.Time
}

// run keeps slot running: start an operator, and start it again (with a new
// identity, as a Deployment starts a new pod) whenever it exits, until the
// scenario ends.
func (e *env) run(slot int) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			p, err := e.start(slot)
			if err != nil {
				if !e.isStopping() {
					e.t.Errorf("starting operator in slot %d: %v", slot, err)
				}
				return
			}
			<-p.exited
			if e.isStopping() {
				return
			}
			select {
			case <-time.After(restartDelay):
			case <-e.ctx.Done():
				return
			}
			if e.isStopping() {
				return
			}
		}
	}()
}

func (e *env) isStopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (e *env) start(slot int) (*opProc, error) {
	e.mu.Lock()
	gen := e.gens[slot]
	e.gens[slot]++
	e.mu.Unlock()
	id := fmt.Sprintf("op%d", slot)
	if gen > 0 {
		id = fmt.Sprintf("op%d-r%d", slot, gen)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	leaseDSN, storeDSN := e.dsnFor(slot)
	p := &opProc{slot: slot, id: id, probe: fmt.Sprintf("127.0.0.1:%d", port),
		log: filepath.Join(e.logDir, id+".log"), exited: make(chan struct{})}
	args := []string{
		"-kubeconfig", e.h.kubeconfig,
		"-store-dsn", storeDSN,
		"-id", id,
		"-namespace", e.name,
		"-lock", e.lock,
		"-election-id", e.name,
		"-lease-duration", cmp.Or(e.ld, ttl).String(),
		"-renew-deadline", cmp.Or(e.rd, renewDeadline).String(),
		"-retry-period", cmp.Or(e.rp, retryPeriod).String(),
		"-health-probe-bind-address", p.probe,
	}
	if e.lock == "pglease" {
		args = append(args, "-lease-dsn", leaseDSN)
	}
	args = append(args, e.args...)
	if e.extraArgs != nil {
		args = append(args, e.extraArgs(slot)...)
	}
	p.cmd = exec.Command(e.h.bin, args...)
	p.cmd.Env = append(os.Environ(), "PGLEASE_DSN=", "PGLEASE_STORE_DSN=")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd.Stderr = logf
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	e.mu.Lock()
	if e.stopping {
		e.mu.Unlock()
		logf.Close()
		return nil, fmt.Errorf("scenario is over")
	}
	if err := p.cmd.Start(); err != nil {
		e.mu.Unlock()
		logf.Close()
		return nil, err
	}
	e.procs = append(e.procs, p)
	e.current[slot] = p
	e.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev opEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				e.t.Errorf("%s: not an event: %q: %v", id, sc.Text(), err)
				continue
			}
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		}
		_ = p.cmd.Wait() // the status is read below
		logf.Close()
		e.mu.Lock()
		p.exitAt = time.Now()
		p.exitCode = p.cmd.ProcessState.ExitCode()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exitCode = -int(ws.Signal())
		}
		e.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// signal sends sig to p and records when.
func (e *env) signal(p *opProc, sig syscall.Signal) time.Time {
	e.t.Helper()
	e.mu.Lock()
	at := time.Now()
	p.signals = append(p.signals, sentSignal{sig: sig, at: at})
	e.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		e.t.Fatalf("signal %v to %s: %v", sig, p.id, err)
	}
	e.t.Logf("%s: sent %s to %s (pid %d)", at.Format("15:04:05.000"), sigName(sig), p.id, p.cmd.Process.Pid)
	return at
}

func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	case syscall.SIGCONT:
		return "SIGCONT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

func (e *env) stopAll() {
	e.mu.Lock()
	e.stopping = true
	procs := slices.Clone(e.procs)
	e.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	for _, p := range procs {
		<-p.exited
	}
	e.wg.Wait()
	if e.t.Failed() {
		e.t.Logf("events:\n%s", e.eventLog())
		for _, p := range procs {
			b, _ := os.ReadFile(p.log)
			const max = 3000
			if len(b) > max {
				b = b[len(b)-max:]
			}
			e.t.Logf("--- %s stderr (tail):\n%s", p.id, b)
		}
	}
}

func (e *env) eventLog() string {
	var b strings.Builder
	for _, ev := range e.allEvents() {
		if ev.Event == "write" {
			continue // too many; the audit table has them
		}
		b.WriteString(ev.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func (e *env) allEvents() []opEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.events)
}

// mark is the number of events so far: await(mark, ...) looks only at later
// ones.
func (e *env) mark() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// await waits for the first event from index from on that matches.
func (e *env) await(from int, within time.Duration, what string, match func(opEvent) bool) opEvent {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		e.mu.Lock()
		for _, ev := range e.events[min(from, len(e.events)):] {
			if match(ev) {
				e.mu.Unlock()
				return ev
			}
		}
		e.mu.Unlock()
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) proc(slot int) *opProc {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.current[slot]
}

func (e *env) procByID(id string) *opProc {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		if p.id == id {
			return p
		}
	}
	return nil
}

// awaitReady waits until the operator of every slot answers /healthz and
// /readyz with 200.
func (e *env) awaitReady(within time.Duration, slots ...int) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: time.Second}
	get := func(url string) bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	for _, slot := range slots {
		for {
			p := e.proc(slot)
			if p != nil && get("http://"+p.probe+"/healthz") && get("http://"+p.probe+"/readyz") {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("operator of slot %d not ready within %v", slot, within)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// term is one epoch as a process led under it.
type term struct {
	id         string
	epoch      int64
	start, end time.Time // end zero: still live
	how        string    // how it ended
}

func (tm term) String() string {
	end := "live"
	if !tm.end.IsZero() {
		end = tm.end.Format("15:04:05.000") + " (" + tm.how + ")"
	}
	return fmt.Sprintf("%s@%d %s–%s", tm.id, tm.epoch, tm.start.Format("15:04:05.000"), end)
}

// terms rebuilds every term from the events: from epoch-start to the first
// of its epoch-end, the process's exit, and a SIGKILL or SIGSTOP the test
// sent it (a stopped process cannot act until it runs again, and then its
// term ends at once: what it does then is for the guard to reject).
func (e *env) terms() []term {
	e.mu.Lock()
	defer e.mu.Unlock()
	byID := map[string]*opProc{}
	for _, p := range e.procs {
		byID[p.id] = p
	}
	var out []term
	for i, ev := range e.events {
		if ev.Event != "epoch-start" {
			continue
		}
		tm := term{id: ev.ID, epoch: ev.Epoch, start: ev.Time}
		end := func(at time.Time, how string) {
			if !at.IsZero() && !at.Before(tm.start) && (tm.end.IsZero() || at.Before(tm.end)) {
				tm.end, tm.how = at, how
			}
		}
		for _, later := range e.events[i+1:] {
			if later.ID != ev.ID {
				continue
			}
			if later.Event == "epoch-end" && later.Epoch == ev.Epoch || later.Event == "exit" {
				end(later.Time, later.Event)
				break
			}
		}
		if p := byID[ev.ID]; p != nil {
			end(p.exitAt, "process exit")
			for _, s := range p.signals {
				if s.sig == syscall.SIGKILL || s.sig == syscall.SIGSTOP {
					end(s.at, sigName(s.sig))
				}
			}
		}
		out = append(out, tm)
	}
	slices.SortFunc(out, func(a, b term) int { return a.start.Compare(b.start) })
	return out
}

// liveTerms are the terms that have not ended.
func (e *env) liveTerms() []term {
	var live []term
	for _, tm := range e.terms() {
		if tm.end.IsZero() {
			live = append(live, tm)
		}
	}
	return live
}

// awaitLeader waits for an epoch-start from index from on (optionally by
// another process than not) and returns it.
func (e *env) awaitLeader(from int, within time.Duration, not string) opEvent {
	e.t.Helper()
	return e.await(from, within, "new leader", func(ev opEvent) bool {
		return ev.Event == "epoch-start" && ev.ID != not
	})
}

// holder reads who holds the lease now, from the lock's own store: the
// pg_lease key, or the Lease object.
func (e *env) holder() (id string, epoch int64, held bool, err error) {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	if e.lock == "pglease" {
		s, err := e.leases.Inspect(ctx, e.name)
		if err != nil {
			return "", 0, false, err
		}
		return s.Owner, s.Epoch, s.Held, nil
	}
	var l coordinationv1.Lease
	if err := e.h.kube.Get(ctx, types.NamespacedName{Namespace: e.name, Name: e.name}, &l); err != nil {
		return "", 0, false, err
	}
	tr := int64(0)
	if l.Spec.LeaseTransitions != nil {
		tr = int64(*l.Spec.LeaseTransitions)
	}
	h := ""
	if l.Spec.HolderIdentity != nil {
		h = *l.Spec.HolderIdentity
	}
	return h, tr + 1, h != "", nil
}

// sample is the lease as the test saw it (pg_lease: inspect; Lease: the
// object) every 50ms.
type sample struct {
	at        time.Time
	owner     string
	epoch     int64
	held      bool
	expiresAt time.Time // pg_lease, while held
}

func (e *env) sample() {
	defer e.wg.Done()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-tick.C:
		}
		if e.isStopping() {
			return
		}
		s := sample{at: time.Now()}
		ctx, cancel := context.WithTimeout(e.ctx, time.Second)
		if e.lock == "pglease" {
			st, err := e.leases.Inspect(ctx, e.name)
			cancel()
			if err != nil || !st.Exists {
				continue
			}
			s.owner, s.epoch, s.held, s.expiresAt = st.Owner, st.Epoch, st.Held, st.ExpiresAt
		} else {
			cancel()
			id, epoch, held, err := e.holder()
			if err != nil {
				continue
			}
			s.owner, s.epoch, s.held = id, epoch, held
		}
		e.samples.Add(s)
	}
}

func (e *env) allSamples() []sample { return e.samples.All() }

// workload creates ConfigMaps and keeps changing them.
type workload struct {
	e     *env
	names []string
	stop  chan struct{}
	done  chan struct{}
	n     int
}

// startWorkload creates n labelled ConfigMaps (and one unlabelled, which no
// operator may write about), then updates a random one every interval until
// stopped.
func (e *env) startWorkload(n int, interval time.Duration) *workload {
	e.t.Helper()
	w := &workload{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for i := range n {
		name := fmt.Sprintf("cm-%d", i)
		w.names = append(w.names, name)
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.name, Name: name, Labels: map[string]string{watchLabel: "true"}},
			Data:       map[string]string{"n": "0", "name": name},
		}
		if err := e.h.kube.Create(ctx, cm); err != nil {
			e.t.Fatal(err)
		}
	}
	ignored := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.name, Name: "not-watched"},
		Data:       map[string]string{"n": "0"},
	}
	if err := e.h.kube.Create(ctx, ignored); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(w.Stop)
	go func() {
		defer close(w.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			w.n++
			w.update(w.names[rand.IntN(len(w.names))], map[string]string{"n": strconv.Itoa(w.n)}, nil)
		}
	}()
	return w
}

// update merges data and annotations into a ConfigMap.
func (w *workload) update(name string, data, annotations map[string]string) {
	ctx, cancel := context.WithTimeout(w.e.ctx, 10*time.Second)
	defer cancel()
	var cm corev1.ConfigMap
	for attempt := 0; ; attempt++ {
		err := w.e.h.kube.Get(ctx, types.NamespacedName{Namespace: w.e.name, Name: name}, &cm)
		if err == nil {
			patch := client.MergeFrom(cm.DeepCopy())
			for k, v := range data {
				cm.Data[k] = v
			}
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			for k, v := range annotations {
				cm.Annotations[k] = v
			}
			err = w.e.h.kube.Patch(ctx, &cm, patch)
		}
		if err == nil {
			return
		}
		if w.e.ctx.Err() != nil {
			return // the scenario is over
		}
		if attempt == 5 || ctx.Err() != nil {
			w.e.t.Errorf("updating ConfigMap %s: %v", name, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *workload) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// auditRow is one accepted write.
type auditRow struct {
	seq                  int64
	resource, writer, rv string
	epoch                int64
	acceptedAt           time.Time
}

func (e *env) audit() []auditRow {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	rows, err := e.store.Query(ctx, `SELECT seq, resource, epoch, writer, resource_version, accepted_at
FROM operator_audit ORDER BY resource, seq`)
	if err != nil {
		e.t.Fatalf("reading the audit table: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (auditRow, error) {
		var a auditRow
		err := r.Scan(&a.seq, &a.resource, &a.epoch, &a.writer, &a.rv, &a.acceptedAt)
		return a, err
	})
	if err != nil {
		e.t.Fatalf("reading the audit table: %v", err)
	}
	return out
}

// verify stops the workload and checks the scenario's whole history:
//
//   - no result lost: every watched ConfigMap ends with a result row of its
//     final resourceVersion and data, written by a process that led under
//     the row's epoch; the unwatched one has none;
//   - the store accepted, per resource and in acceptance order, no epoch
//     lower than one it had accepted before, and every accepted write
//     carries the epoch its writer led under;
//   - the terms, in the order they started, have increasing epochs and never
//     overlap: never two leaders;
//   - the lease's epoch, as the test sampled it, never went down.
func (e *env) verify(w *workload) {
	t := e.t
	t.Helper()
	w.Stop()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()

	var list corev1.ConfigMapList
	if err := e.h.kube.List(ctx, &list, client.InNamespace(e.name), client.MatchingLabels{watchLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(w.names) {
		t.Fatalf("%d watched ConfigMaps, want %d", len(list.Items), len(w.names))
	}
	type final struct {
		rv   string
		data map[string]string
	}
	want := map[string]final{}
	for _, cm := range list.Items {
		want[e.name+"/"+cm.Name] = final{cm.ResourceVersion, cm.Data}
	}
	start := time.Now()
	var missing []string
	for {
		missing = missing[:0]
		got := map[string]final{}
		rows, err := e.store.Query(ctx, `SELECT resource, resource_version, data FROM operator_results`)
		if err == nil {
			for rows.Next() {
				var res, rv string
				var data map[string]string
				if err := rows.Scan(&res, &rv, &data); err != nil {
					t.Fatal(err)
				}
				got[res] = final{rv, data}
			}
			err = rows.Err()
		}
		if err != nil {
			t.Logf("reading results: %v", err)
		}
		for res, f := range want {
			g, ok := got[res]
			if !ok || g.rv != f.rv || !maps.Equal(g.data, f.data) {
				missing = append(missing, fmt.Sprintf("%s: want rv %s %v, have %v", res, f.rv, f.data, g))
			}
		}
		if _, ok := got[e.name+"/not-watched"]; ok {
			t.Errorf("a result was written for the unwatched ConfigMap")
		}
		if len(missing) == 0 {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("results lost or stale after %v:\n%s", time.Since(start).Round(time.Millisecond), strings.Join(missing, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every result final %v after the workload stopped (%d updates)", time.Since(start).Round(time.Millisecond), w.n)

	terms := e.terms()
	led := map[string]bool{}
	for _, tm := range terms {
		led[fmt.Sprintf("%s@%d", tm.id, tm.epoch)] = true
	}
	rows := e.audit()
	if len(rows) == 0 {
		t.Fatal("the audit table is empty")
	}
	highest := map[string]auditRow{}
	writers := map[string]int{}
	for _, a := range rows {
		if prev, ok := highest[a.resource]; ok && a.epoch < prev.epoch {
			t.Errorf("store accepted %s epoch %d (seq %d, by %s) after epoch %d (seq %d, by %s)",
				a.resource, a.epoch, a.seq, a.writer, prev.epoch, prev.seq, prev.writer)
		}
		if prev, ok := highest[a.resource]; !ok || a.epoch >= prev.epoch {
			highest[a.resource] = a
		}
		k := fmt.Sprintf("%s@%d", a.writer, a.epoch)
		if !led[k] {
			t.Errorf("store accepted a write of %s by %s with epoch %d, under which it never led", a.resource, a.writer, a.epoch)
		}
		writers[k]++
	}
	t.Logf("audit: %d accepted writes by %v", len(rows), writers)

	var lines []string
	for i, tm := range terms {
		lines = append(lines, tm.String())
		if i == 0 {
			continue
		}
		prev := terms[i-1]
		if tm.epoch <= prev.epoch {
			t.Errorf("term %v started after %v with a lower or equal epoch", tm, prev)
		}
		if prev.end.IsZero() || tm.start.Before(prev.end) {
			t.Errorf("two leaders: %v started before %v ended", tm, prev)
		}
	}
	t.Logf("terms:\n%s", strings.Join(lines, "\n"))
	t.Logf("events (writes left out):\n%s", e.eventLog())

	var last sample
	for _, s := range e.allSamples() {
		if s.epoch < last.epoch {
			t.Errorf("lease epoch went down: %d (%s) at %s after %d (%s) at %s", s.epoch, s.owner,
				s.at.Format("15:04:05.000"), last.epoch, last.owner, last.at.Format("15:04:05.000"))
		}
		last = s
	}
}

// timings collects the measured handoffs and takeovers of every scenario.
type timings struct {
	mu   sync.Mutex
	rows []measurement
}

type measurement struct {
	lock, what string
	d          time.Duration
}

func (tg *timings) add(lock, what string, d time.Duration) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.rows = append(tg.rows, measurement{lock, what, d})
}

func (tg *timings) table() string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	type key struct{ what, lock string }
	var keys []key
	all := map[key][]time.Duration{}
	for _, r := range tg.rows {
		k := key{r.what, r.lock}
		if _, ok := all[k]; !ok {
			keys = append(keys, k)
		}
		all[k] = append(all[k], r.d)
	}
	slices.SortStableFunc(keys, func(a, b key) int { return strings.Compare(a.what, b.what) })
	var b strings.Builder
	fmt.Fprintf(&b, "TTL %v, RenewDeadline %v, RetryPeriod %v\n", ttl, renewDeadline, retryPeriod)
	fmt.Fprintf(&b, "%-44s %-8s %s\n", "measurement", "lock", "each")
	for _, k := range keys {
		var ds []string
		for _, d := range all[k] {
			ds = append(ds, d.Round(time.Millisecond).String())
		}
		fmt.Fprintf(&b, "%-44s %-8s %s\n", k.what, k.lock, strings.Join(ds, " "))
	}
	return b.String()
}

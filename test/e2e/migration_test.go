package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"k8s.io/client-go/rest"
)

// Timings of the migration test's processes (checked by
// pkg/leaderelection: 1.5s + 0.3s < 3s − 0.3s).
const (
	migLeaseDuration = 3 * time.Second
	migRenewDeadline = 1500 * time.Millisecond
	migRetryPeriod   = 300 * time.Millisecond
)

var (
	dropinBins sync.Map // package path → *dropinBinary
)

type dropinBinary struct {
	once sync.Once
	path string
	err  error
}

// dropinBuild builds a main package of the module once per test binary.
func dropinBuild(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := dropinBins.LoadOrStore(pkg, &dropinBinary{})
	b := v.(*dropinBinary)
	b.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			b.err = err
			return
		}
		dir, err := os.MkdirTemp("", "pglease-e2e-bin-")
		if err != nil {
			b.err = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = "/usr/local/go/bin/go"
		}
		path := filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command(goBin, "build", "-o", path, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
			return
		}
		b.path = path
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// dropinLeaseDB starts a throwaway PostgreSQL with pg_lease installed in a
// database "leases" and returns its DSN.
func dropinLeaseDB(t *testing.T) string {
	t.Helper()
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pg.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := pg.CreateDatabase(ctx, "leases")
	if err != nil {
		t.Fatal(err)
	}
	if err := leaseadmin.InstallExtension(ctx, newPool(t, dsn)); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// migEvent is one line of test/e2e/migrant's output.
type migEvent struct {
	Time  time.Time `json:"time"`
	Event string    `json:"event"`
	ID    string    `json:"id"`
	Epoch int64     `json:"epoch"`
	Error string    `json:"error"`
}

type migProc struct {
	id, mode string
	cmd      *exec.Cmd
	log      string
	exited   chan struct{}
}

// migWorld runs migrant processes against one control plane and database.
type migWorld struct {
	t          *testing.T
	bin        string
	kubeconfig string
	dsn        string
	logDir     string
	pool       *pgxpool.Pool

	mu     sync.Mutex
	events []migEvent
	procs  []*migProc
}

func (w *migWorld) start(id, mode string) *migProc {
	w.t.Helper()
	p := &migProc{id: id, mode: mode, log: filepath.Join(w.logDir, id+".log"), exited: make(chan struct{})}
	p.cmd = exec.Command(w.bin,
		"--kubeconfig", w.kubeconfig,
		"--id", id,
		"--leader-elect",
		"--leader-elect-resource-lock", mode,
		"--leader-elect-resource-namespace", "default",
		"--leader-elect-lease-duration", migLeaseDuration.String(),
		"--leader-elect-renew-deadline", migRenewDeadline.String(),
		"--leader-elect-retry-period", migRetryPeriod.String(),
	)
	p.cmd.Env = append(os.Environ(), "PGLEASE_DSN="+w.dsn, "MIGRANT_REFEREE_DSN="+w.dsn, "KUBECONFIG=")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(p.log)
	if err != nil {
		w.t.Fatal(err)
	}
	p.cmd.Stderr = logf
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev migEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				w.t.Errorf("%s: not an event: %q", id, sc.Text())
				continue
			}
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
		}
		_ = p.cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	w.await(fmt.Sprintf("%s started", id), func(ev migEvent) bool { return ev.ID == id && ev.Event == "started" })
	// A surge pod runs beside the current leader for a while (the leader
	// writes 50 more rows: several retry periods of the new candidate)
	// before the rollout goes on.
	w.mu.Lock()
	ev, ok := w.current()
	w.mu.Unlock()
	if ok {
		for _, q := range w.procs {
			if q.id == ev.ID {
				w.awaitRows(q, 50)
			}
		}
	}
	return p
}

// await waits (up to a minute: a bound, not an assertion on time) for an
// event matching f and returns it.
func (w *migWorld) await(what string, f func(migEvent) bool) migEvent {
	w.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, ev := range w.events {
			if f(ev) {
				w.mu.Unlock()
				return ev
			}
		}
		w.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	w.t.Fatalf("waiting for %s: not within a minute; events:\n%s", what, w.eventLog())
	return migEvent{}
}

// leader returns the process leading now (its last event is "leading"),
// waiting for one.
func (w *migWorld) leader(what string) (*migProc, migEvent) {
	w.t.Helper()
	var ev migEvent
	w.await(what, func(migEvent) bool {
		var ok bool
		ev, ok = w.current()
		return ok
	})
	for _, p := range w.procs {
		if p.id == ev.ID {
			w.awaitRows(p, 25)
			return p, ev
		}
	}
	w.t.Fatalf("no process %s", ev.ID)
	return nil, ev
}

// awaitRows waits until p has written n more referee rows, so that every
// leader acts for a while beside the other candidates.
func (w *migWorld) awaitRows(p *migProc, n int) {
	w.t.Helper()
	count := func() int {
		var c int
		if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM referee WHERE id = $1`, p.id).Scan(&c); err != nil {
			w.t.Fatal(err)
		}
		return c
	}
	want := count() + n
	deadline := time.Now().Add(time.Minute)
	for count() < want {
		if time.Now().After(deadline) {
			w.t.Fatalf("%s leads but wrote fewer than %d referee rows in a minute; events:\n%s", p.id, n, w.eventLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// current is called with w.mu held.
func (w *migWorld) current() (migEvent, bool) {
	last := map[string]migEvent{}
	for _, ev := range w.events {
		if ev.Event == "leading" || ev.Event == "stopped" || ev.Event == "exit" {
			last[ev.ID] = ev
		}
	}
	for _, p := range w.procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		if ev, ok := last[p.id]; ok && ev.Event == "leading" {
			return ev, true
		}
	}
	return migEvent{}, false
}

func (w *migWorld) stop(p *migProc, sig syscall.Signal) {
	w.t.Helper()
	w.t.Logf("%s %s (%s)", sigName(sig), p.id, p.mode)
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		w.t.Fatalf("%s did not exit within a minute of %v", p.id, sig)
	}
}

func (w *migWorld) stopAll() {
	for _, p := range w.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range w.procs {
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

func (w *migWorld) eventLog() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, ev := range w.events {
		fmt.Fprintf(&b, "  %s %s %s epoch=%d %s\n", ev.Time.Format("15:04:05.000"), ev.ID, ev.Event, ev.Epoch, ev.Error)
	}
	return b.String()
}

// TestMigrationFromLeases is the rolling update from leases to pglease on a
// real kube-apiserver: old pods elect through the coordination.k8s.io Lease
// (resource lock "leases", client-go's LeaseLock inside controller-runtime),
// new pods through "leases+pglease" (both locks), and a later rollout
// through "pglease" alone. Pods are replaced one at a time, leaders are
// stopped (SIGTERM, releasing) and killed (SIGKILL, expiring: an old pod and
// a migrating one), and every
// leader writes referee rows for as long as it leads. Never two leaders:
// the referee rows, in server-clock order, form no more runs of one writer
// than there were leadership starts (two leaders at once interleave their
// rows, each switch a run). Never a leaderless end state: after each step a
// live process leads.
func TestMigrationFromLeases(t *testing.T) {
	cfg := StartControlPlane(t)
	w := newMigWorld(t, cfg)
	pool := w.pool
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE referee (n bigserial PRIMARY KEY, id text NOT NULL, at timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// Old pods: the Lease only.
	old1 := w.start("old1", "leases")
	old2 := w.start("old2", "leases")
	p, _ := w.leader("an old pod leads")
	t.Logf("leader: %s", p.id)

	// Rolling update, one pod at a time: surge a new pod, then take an old
	// one down, the leader first (SIGTERM: it releases).
	new1 := w.start("new1", "leases+pglease")
	first, second := old1, old2
	if p == old2 {
		first, second = old2, old1
	}
	w.stop(first, syscall.SIGTERM)
	p, _ = w.leader("a leader after the first old pod stopped")
	t.Logf("leader: %s", p.id)
	new2 := w.start("new2", "leases+pglease")
	// The last old pod dies without releasing (SIGKILL): if it led, the
	// Lease expires on the new pods' clocks before one of them leads.
	w.stop(second, syscall.SIGKILL)
	p, ev := w.leader("a new pod leads once the old pods are gone")
	if p.mode != "leases+pglease" || ev.Epoch == 0 {
		t.Fatalf("leader %s (%s) at epoch %d, want a leases+pglease pod with a pg_lease epoch", p.id, p.mode, ev.Epoch)
	}
	// A new leader that dies (no release): its successor waits for both
	// locks to expire.
	new3 := w.start("new3", "leases+pglease")
	killed := time.Now()
	w.stop(p, syscall.SIGKILL)
	p2, ev2 := w.leader("a new pod takes over from a killed one")
	if ev2.Epoch <= ev.Epoch {
		t.Fatalf("after killing %s at epoch %d, %s leads at epoch %d", p.id, ev.Epoch, p2.id, ev2.Epoch)
	}
	// A number for the documentation, not an assertion.
	t.Logf("takeover after SIGKILL of a migrating leader: %v (leaseDuration %v, retryPeriod %v)",
		ev2.Time.Sub(killed).Round(10*time.Millisecond), migLeaseDuration, migRetryPeriod)

	// The next rollout drops the Lease: pglease pods beside the migrating ones.
	fin1 := w.start("fin1", "pglease")
	fin2 := w.start("fin2", "pglease")
	for _, q := range []*migProc{new1, new2, new3} {
		select {
		case <-q.exited:
			continue
		default:
		}
		w.stop(q, syscall.SIGTERM)
		w.leader("a leader after " + q.id + " stopped")
	}
	p, ev = w.leader("a pglease pod leads at the end")
	if p.mode != "pglease" || ev.Epoch == 0 {
		t.Fatalf("final leader %s (%s) at epoch %d, want a pglease pod", p.id, p.mode, ev.Epoch)
	}
	other := fin1
	if p == fin1 {
		other = fin2
	}
	w.stop(p, syscall.SIGTERM)
	if q, _ := w.leader("the other pglease pod takes over"); q != other {
		t.Fatalf("leader %s, want %s", q.id, other.id)
	}
	w.stopAll()

	// Verdict.
	w.mu.Lock()
	starts := 0
	var lastEpoch int64
	for _, ev := range w.events {
		if ev.Event != "leading" {
			continue
		}
		starts++
		if ev.Epoch != 0 {
			if ev.Epoch <= lastEpoch {
				t.Errorf("%s led at epoch %d after epoch %d", ev.ID, ev.Epoch, lastEpoch)
			}
			lastEpoch = ev.Epoch
		}
	}
	w.mu.Unlock()
	rows, err := pool.Query(ctx, `SELECT id FROM referee ORDER BY at, n`)
	if err != nil {
		t.Fatal(err)
	}
	var runs []string
	total := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		total++
		if len(runs) == 0 || runs[len(runs)-1] != id {
			runs = append(runs, id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d leadership starts, %d referee rows in %d runs: %v", starts, total, len(runs), runs)
	if len(runs) > starts {
		t.Errorf("two leaders at once: the referee rows form %d runs of one writer, more than the %d leadership starts: %v\nevents:\n%s",
			len(runs), starts, runs, w.eventLog())
	}
	if starts < 5 {
		t.Errorf("only %d leadership starts; the scenario hands over at least 5 times:\n%s", starts, w.eventLog())
	}
}

func newMigWorld(t *testing.T, cfg *rest.Config) *migWorld {
	w := &migWorld{t: t, bin: dropinBuild(t, "./test/e2e/migrant"), kubeconfig: writeKubeconfig(t, cfg),
		dsn: dropinLeaseDB(t), logDir: t.TempDir()}
	w.pool = newPool(t, w.dsn)
	t.Cleanup(func() {
		w.stopAll()
		if t.Failed() {
			for _, p := range w.procs {
				t.Logf("%s log:\n%s", p.id, tail(p.log))
			}
		}
	})
	return w
}

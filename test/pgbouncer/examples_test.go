package pgbouncer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pglease/pg_lease/internal/kubetest"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

const examplesPkg = "github.com/pglease/pg_lease/examples/"

// TestExamplesThroughPgBouncer builds the example programs and runs them as
// processes, as a user would, with their DSN pointing at a real PgBouncer
// in session and in transaction pooling (with the statement settings of
// docs/operations.md): fenced-writer's whole story, three clientgo
// candidates through a handoff and a takeover, a clientgo leader stopped
// while its renewal waits on the server, and two manager replicas on a real
// kube-apiserver through a handoff. No bouncer may see a cancel request.
func TestExamplesThroughPgBouncer(t *testing.T) {
	bins := pgtest.BuildPrograms(t, examplesPkg+"fenced-writer", examplesPkg+"clientgo", examplesPkg+"manager")
	s := newSetup(t)
	t.Run("fenced-writer", func(t *testing.T) { testFencedWriterExample(t, s, bins[examplesPkg+"fenced-writer"]) })
	t.Run("clientgo", func(t *testing.T) { testClientGoExample(t, s, bins[examplesPkg+"clientgo"]) })
	t.Run("clientgo-stop-in-renewal", func(t *testing.T) { testClientGoStopInRenewal(t, s, bins[examplesPkg+"clientgo"]) })
	t.Run("manager", func(t *testing.T) { testManagerExample(t, s, bins[examplesPkg+"manager"]) })
	s.checkNoCancelRequests(t)
}

// sized is dsn with the pool small enough that every process of a test
// gets its server connections in session pooling, where each client
// connection holds one for its life: three processes of at most two pooled
// connections and a Waiter each fit the bouncer's default_pool_size of 10,
// as docs/operations.md says to size it.
func sized(mode, dsn string) string {
	if mode != "session" {
		return dsn
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "pool_max_conns=2"
}

// testFencedWriterExample: examples/fenced-writer through each mode, both
// its lease database (where it creates pg_lease) and its store; the output
// is the one its own test expects.
func testFencedWriterExample(t *testing.T, s *setup, bin string) {
	s.forEachMode(t, func(t *testing.T, mode, _ string) {
		_, leases := s.newDatabase(t, false)
		_, store := s.newDatabase(t, false)
		cmd := exec.CommandContext(pgtest.Context(t, time.Minute), bin, "-store-dsn", store[mode])
		cmd.Env = append(os.Environ(), "PGLEASE_DSN="+leases[mode])
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("fenced-writer through %s pooling: %v\nstdout:\n%s\nstderr:\n%s", mode, err, &stdout, &stderr)
		}
		// The story the example's own test expects, told through the pooler.
		want, err := os.ReadFile("../../examples/fenced-writer/testdata/story.txt")
		if err != nil {
			t.Fatal(err)
		}
		if got := stdout.String(); got != string(want) {
			t.Errorf("fenced-writer through %s pooling printed:\n%s\nwant:\n%s", mode, got, want)
		}
	})
}

// testClientGoExample: three examples/clientgo candidates on one key
// through each mode. The first leader prints its token and the server
// agrees; SIGTERM hands the key to a follower (the leader releases: the
// release takes an epoch, the follower's grant the next, no lapse waited
// for); SIGKILL of the new leader lets the last one take over at the next
// epoch once the grant lapsed on the server. The key's history on the
// server records exactly these changes, and the processes' lines show one
// leader at a time.
func testClientGoExample(t *testing.T, s *setup, bin string) {
	direct := newPool(t, s.direct)
	admin := lease.New(direct)
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		key := "example-clientgo-" + mode
		lines := make(chan exampleLine, 1000)
		procs := map[string]*exampleProc{}
		for _, id := range []string{"a", "b", "c"} {
			procs[id] = startExample(t, bin, id, "PGLEASE_DSN="+sized(mode, dsn), lines,
				"-id", id, "-key", key, "-lease-duration", ttl.String())
		}
		events := pgtest.NewEvents(lines)
		await := func(what string, match func(exampleLine) bool) exampleLine {
			t.Helper()
			return events.Await(t, time.Minute, what, match)
		}
		kills := map[string]time.Time{}

		first := await("a first leader", func(l exampleLine) bool { return l.kind == "leading" })
		e := first.tok.Epoch
		serverHolds(t, admin, key, first.id, e)
		if first.tok != (lease.Token{Key: key, Owner: first.id, Epoch: e}) {
			t.Fatalf("%s printed the token %v", first.id, first.tok)
		}
		for id, p := range procs {
			if id != first.id {
				p.awaitStderr(t, "Attempting to acquire leader lease") // client-go's first attempt
			}
		}
		settle(t, direct, admin, key)

		// SIGTERM: the leader ends its term, releases, and exits 0.
		termed := procs[first.id].signal(t, syscall.SIGTERM)
		var end, second exampleLine
		await("the leader's term to end and a follower to lead", func(l exampleLine) bool {
			switch {
			case l.kind == "epoch-end" && l.id == first.id:
				end = l
			case l.kind == "epoch-start" && l.id != first.id:
				second = l
			}
			return end.id != "" && second.id != ""
		})
		if end.tok.Epoch != e || second.tok.Epoch != e+2 {
			t.Fatalf("handoff: %s ended %v, %s started %v; want epoch %d ended, %d granted (the release takes %d)",
				first.id, end.tok, second.id, second.tok, e, e+2, e+1)
		}
		if err := procs[first.id].wait(t); err != nil {
			t.Fatalf("%s after SIGTERM: %v", first.id, err)
		}
		serverHolds(t, admin, key, second.id, e+2)

		// SIGKILL: nothing is released; the last candidate takes over once
		// the grant lapsed on the server.
		killed := procs[second.id].signal(t, syscall.SIGKILL)
		kills[second.id] = killed
		_ = procs[second.id].wait(t)
		third := await("a takeover", func(l exampleLine) bool { return l.kind == "epoch-start" && l.id != second.id })
		if third.id == first.id || third.tok.Epoch != e+3 {
			t.Fatalf("takeover: %s started %v; want the third candidate at epoch %d", third.id, third.tok, e+3)
		}
		serverHolds(t, admin, key, third.id, e+3)

		procs[third.id].signal(t, syscall.SIGTERM)
		if err := procs[third.id].wait(t); err != nil {
			t.Fatalf("%s after SIGTERM: %v", third.id, err)
		}
		if st, err := admin.Inspect(ctx, key); err != nil || st.Held || !st.Released || st.Epoch != e+4 {
			t.Fatalf("after the last leader stopped: %+v %v, want released at epoch %d", st, err, e+4)
		}

		h := history(t, admin, key, []historyStep{
			{leaseadmin.HistoryAcquired, first.id, e}, {leaseadmin.HistoryReleased, first.id, e},
			{leaseadmin.HistoryAcquired, second.id, e + 2},
			{leaseadmin.HistoryTakenOver, third.id, e + 3}, {leaseadmin.HistoryReleased, third.id, e + 3},
		})
		if h[3].PreviousOwner != second.id || h[3].PreviousEpoch != e+2 {
			t.Fatalf("the takeover names %s@%d as the lapsed grant, want %s@%d",
				h[3].PreviousOwner, h[3].PreviousEpoch, second.id, e+2)
		}
		oneLeaderAtATime(t, events.Seen(), kills)
		t.Logf("%s pooling, examples/clientgo (-lease-duration %v): SIGTERM → %s leads %s later (server: leaderless %s); "+
			"SIGKILL → %s leads %s later (server: leaderless %s after the expiry)",
			mode, ttl, second.id, ms(second.at.Sub(termed)), ms(h[2].At.Sub(h[1].At)),
			third.id, ms(third.at.Sub(killed)), ms(h[3].At.Sub(h[3].VacantSince)))
	})
}

// testClientGoStopInRenewal: an examples/clientgo leader stopped while its
// renewal waits on the server (the test holds the key's row lock) lets the
// renewal finish, releases and exits 0, through each mode. pgx would
// interrupt the renewal and send a cancel request, which PgBouncer 1.18 can
// exit on; the test's end checks that none was sent.
func testClientGoStopInRenewal(t *testing.T, s *setup, bin string) {
	direct := newPool(t, s.direct)
	admin := lease.New(direct)
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		key := "example-clientgo-stop-" + mode
		lines := make(chan exampleLine, 100)
		// A 6 s TTL: the renewal's deadline (RenewDeadline, 4 s) stays far
		// from the time the test holds it up.
		p := startExample(t, bin, "a", "PGLEASE_DSN="+sized(mode, dsn), lines, "-id", "a", "-key", key, "-lease-duration", "6s")
		leading := pgtest.NewEvents(lines).Await(t, time.Minute, "the leader", func(l exampleLine) bool { return l.kind == "leading" })
		tx, err := direct.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "SELECT FROM lease.leases WHERE key = $1 FOR UPDATE", key); err != nil {
			t.Fatal(err)
		}
		pgtest.Eventually(t, time.Minute, "the renewal to wait for the key's row", func() bool {
			var n int
			err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%lease.renew(%'`).Scan(&n)
			return err == nil && n > 0
		})
		p.signal(t, syscall.SIGTERM)
		time.Sleep(300 * time.Millisecond) // the stop cancels the renewal's context meanwhile
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.wait(t); err != nil {
			t.Fatalf("the leader stopped in its renewal: %v", err)
		}
		if st, err := admin.Inspect(ctx, key); err != nil || st.Held || !st.Released || st.Epoch != leading.tok.Epoch+1 {
			t.Fatalf("after the leader stopped in its renewal: %+v %v, want released", st, err)
		}
	})
}

// testManagerExample: two examples/manager replicas (controller-runtime,
// pkg/leaderelection) on a real kube-apiserver, through each mode. The
// leader stamps a ConfigMap with its epoch; on SIGTERM it releases and
// exits 0, and the other replica restamps it at the next grant's epoch.
func testManagerExample(t *testing.T, s *setup, bin string) {
	cfg := kubetest.Start(t)
	kubeconfig := kubetest.WriteKubeconfig(t, cfg)
	kube, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	direct := newPool(t, s.direct)
	admin := lease.New(direct)
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		key := "example-manager-" + mode
		cm := types.NamespacedName{Namespace: "default", Name: "demo-" + mode}
		if err := kube.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: cm.Namespace, Name: cm.Name, Labels: map[string]string{"pglease.io/example-mode": mode}}}); err != nil {
			t.Fatal(err)
		}
		stamp := func() (int64, string) {
			t.Helper()
			var got corev1.ConfigMap
			if err := kube.Get(ctx, cm, &got); err != nil {
				t.Fatal(err)
			}
			e, _ := strconv.ParseInt(got.Annotations["pglease.io/epoch"], 10, 64)
			return e, got.Annotations["pglease.io/holder"]
		}
		lines := make(chan exampleLine, 1000)
		procs := map[string]*exampleProc{}
		for _, id := range []string{"m1", "m2"} {
			procs[id] = startExample(t, bin, id, "PGLEASE_DSN="+sized(mode, dsn), lines,
				"-id", id, "-key", key, "-lease-duration", ttl.String(), "-kubeconfig", kubeconfig,
				"-namespace", cm.Namespace, "-selector", "pglease.io/example-mode="+mode, "-health-probe-bind-address", "0")
		}
		events := pgtest.NewEvents(lines)
		reconciled := func(what string, not string) exampleLine {
			t.Helper()
			return events.Await(t, time.Minute, what, func(l exampleLine) bool {
				return l.kind == "reconciled" && l.id != not && len(l.fields) > 0 && l.fields[0] == cm.String()
			})
		}
		first := reconciled("the leader's reconcile", "")
		e := first.tok.Epoch
		serverHolds(t, admin, key, first.id, e)
		if se, h := stamp(); se != e || h != first.id {
			t.Fatalf("%s stamped %d by %q; the leader reconciled under %v", cm, se, h, first.tok)
		}
		other := "m1"
		if first.id == "m1" {
			other = "m2"
		}
		settle(t, direct, admin, key)
		termed := procs[first.id].signal(t, syscall.SIGTERM)
		second := reconciled("the successor's reconcile", first.id)
		if second.id != other || second.tok.Epoch != e+2 {
			t.Fatalf("after the handoff %s reconciled under %v; want %s at epoch %d", second.id, second.tok, other, e+2)
		}
		if se, h := stamp(); se != e+2 || h != other {
			t.Fatalf("%s stamped %d by %q after the handoff", cm, se, h)
		}
		if err := procs[first.id].wait(t); err != nil {
			t.Fatalf("%s after SIGTERM: %v", first.id, err)
		}
		procs[other].signal(t, syscall.SIGTERM)
		if err := procs[other].wait(t); err != nil {
			t.Fatalf("%s after SIGTERM: %v", other, err)
		}
		h := history(t, admin, key, []historyStep{
			{leaseadmin.HistoryAcquired, first.id, e}, {leaseadmin.HistoryReleased, first.id, e},
			{leaseadmin.HistoryAcquired, other, e + 2}, {leaseadmin.HistoryReleased, other, e + 2},
		})
		oneLeaderAtATime(t, events.Seen(), nil)
		t.Logf("%s pooling, examples/manager (-lease-duration %v): SIGTERM → %s reconciles %s later (server: leaderless %s)",
			mode, ttl, other, ms(second.at.Sub(termed)), ms(h[2].At.Sub(h[1].At)))
	})
}

// settle returns a second after the server's present, on the server's
// clock: client-go sleeps up to 2.2 RetryPeriods between a follower's
// attempts, so followers that have begun theirs then wait in their Get (for
// a notification or their poll), as they do in steady state.
func settle(t *testing.T, q pgtest.Querier, c *lease.Client, key string) {
	t.Helper()
	st, err := c.Inspect(pgtest.Context(t, time.Minute), key)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitServerPast(t, q, st.ServerNow.Add(time.Second))
}

// serverHolds fails the test unless lease.inspect says owner holds key at
// epoch.
func serverHolds(t *testing.T, c *lease.Client, key, owner string, epoch int64) {
	t.Helper()
	st, err := c.Inspect(pgtest.Context(t, time.Minute), key)
	if err != nil || !st.Held || st.Owner != owner || st.Epoch != epoch {
		t.Fatalf("inspect %s: %+v %v; want held by %s at epoch %d", key, st, err, owner, epoch)
	}
}

type historyStep struct {
	kind, owner string
	epoch       int64
}

// history returns key's history on the server, failing the test unless it
// is exactly want.
func history(t *testing.T, c *lease.Client, key string, want []historyStep) []leaseadmin.HistoryEvent {
	t.Helper()
	h, err := leaseadmin.History(pgtest.Context(t, time.Minute), c, key, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []historyStep
	for _, e := range h {
		got = append(got, historyStep{e.Kind, e.Owner, e.Epoch})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("history of %s: %v, want %v", key, got, want)
	}
	return h
}

// oneLeaderAtATime fails the test when a process's term began (its
// epoch-start line) while another process's term had neither ended (its
// epoch-end line) nor been killed (kills: when the test sent SIGKILL), or
// when epochs did not increase with time.
func oneLeaderAtATime(t *testing.T, lines []exampleLine, kills map[string]time.Time) {
	t.Helper()
	type change struct {
		at    time.Time
		id    string
		start bool
		epoch int64
	}
	var cs []change
	for _, l := range lines {
		if l.kind == "epoch-start" || l.kind == "epoch-end" {
			cs = append(cs, change{l.at, l.id, l.kind == "epoch-start", l.tok.Epoch})
		}
	}
	for id, at := range kills {
		cs = append(cs, change{at: at, id: id})
	}
	slices.SortStableFunc(cs, func(a, b change) int { return a.at.Compare(b.at) })
	open := map[string]int64{} // process → the epoch of its open term
	var last int64
	for _, c := range cs {
		if !c.start {
			delete(open, c.id)
			continue
		}
		for id, e := range open {
			if id != c.id {
				t.Errorf("%s began epoch %d at %v while %s's epoch %d had not ended", c.id, c.epoch, c.at, id, e)
			}
		}
		if c.epoch <= last {
			t.Errorf("%s began epoch %d at %v, after epoch %d", c.id, c.epoch, c.at, last)
		}
		open[c.id], last = c.epoch, c.epoch
	}
}

// exampleLine is one line an example printed on standard output:
// "<RFC 3339 time> <kind> <fields>...", with the first field that reads as
// a token (key/owner@epoch) parsed.
type exampleLine struct {
	id     string
	at     time.Time
	kind   string
	fields []string
	tok    lease.Token
}

func parseExampleLine(id, s string) (exampleLine, bool) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return exampleLine{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, f[0])
	if err != nil {
		return exampleLine{}, false
	}
	l := exampleLine{id: id, at: at, kind: f[1], fields: f[2:]}
	for _, s := range l.fields {
		i, j := strings.LastIndexByte(s, '@'), strings.IndexByte(s, '/')
		if i < 0 || j < 0 || j > i {
			continue
		}
		if e, err := strconv.ParseInt(s[i+1:], 10, 64); err == nil {
			l.tok = lease.Token{Key: s[:j], Owner: s[j+1 : i], Epoch: e}
			break
		}
	}
	return l, true
}

// exampleProc is one process of an example program.
type exampleProc struct {
	id     string
	cmd    *exec.Cmd
	stderr lockedBuffer
	done   chan struct{} // closed once the process exited and its output was read
	err    error         // how it exited, set before done is closed
}

// startExample starts bin with args and env added to the test's
// environment; its output lines go to lines. It is killed at cleanup, and
// the end of its standard error is logged if the test failed.
func startExample(t *testing.T, bin, id, env string, lines chan<- exampleLine, args ...string) *exampleProc {
	t.Helper()
	p := &exampleProc{id: id, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env)
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := parseExampleLine(id, sc.Text()); ok {
				lines <- l
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			out := p.stderr.String()
			t.Logf("%s %s standard error, last part:\n%s", bin, id, out[max(0, len(out)-4<<10):])
		}
	})
	return p
}

// signal sends sig and returns when it was sent.
func (p *exampleProc) signal(t *testing.T, sig syscall.Signal) time.Time {
	t.Helper()
	at := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return at
}

// wait returns how the process exited; it fails the test if it has not
// within a minute.
func (p *exampleProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit within a minute", p.id)
		return nil
	}
}

// awaitStderr waits until the process has written s to standard error.
func (p *exampleProc) awaitStderr(t *testing.T, s string) {
	t.Helper()
	pgtest.Eventually(t, time.Minute, fmt.Sprintf("%s to log %q", p.id, s), func() bool {
		select {
		case <-p.done:
			if !strings.Contains(p.stderr.String(), s) {
				t.Fatalf("%s exited (%v) without logging %q", p.id, p.err, s)
			}
		default:
		}
		return strings.Contains(p.stderr.String(), s)
	})
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

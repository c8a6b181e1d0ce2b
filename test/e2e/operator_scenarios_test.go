package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/robustness"
)

// TestOperator runs examples/operator as three separate processes against a
// real kube-apiserver and a throwaway PostgreSQL (the lease database and
// the store), and breaks things: the leader killed, frozen, cut off from
// PostgreSQL, PostgreSQL restarted and crashed, a rolling restart. After
// each scenario env.verify checks the store's audit of accepted writes and
// the terms the processes reported. Scenarios a, b and e also run with
// client-go's own Lease lock (-lock=lease), and the handoff and takeover
// times of both locks are logged in a table at the end.
//
// Scenarios run one after the other: each starts five processes
// (PostgreSQL, three operators, the test's own clients) on a shared
// control plane, and the machine may have two cores.
func TestOperator(t *testing.T) {
	h := newHarness(t)
	both, pgOnly := []string{"pglease", "lease"}, []string{"pglease"}
	scenarios := []struct {
		name  string
		locks []string
		run   func(*env)
	}{
		{"a-steady-state", both, scenarioSteady},
		{"b-kill-leader", both, scenarioKill},
		{"c-frozen-leader", pgOnly, scenarioFrozen},
		{"d-postgres-restart", pgOnly, scenarioPostgres},
		{"e-rolling-restart", both, scenarioRolling},
		{"f-partitioned-leader", pgOnly, scenarioPartition},
	}
	for _, lock := range both {
		for _, sc := range scenarios {
			if !slices.Contains(sc.locks, lock) {
				continue
			}
			t.Run(lock+"/"+sc.name, func(t *testing.T) {
				sc.run(h.newEnv(t, lock, lock+"-"+sc.name))
			})
		}
	}
	t.Logf("handoff and takeover times (each: one measurement per handoff):\n%s", h.timings.table())
}

// startOperators starts the operators of slots (each kept running by its
// supervisor), waits until they are ready and one leads, and returns the
// leader's term.
func (e *env) startOperators(slots ...int) term {
	e.t.Helper()
	for _, s := range slots {
		e.run(s)
	}
	e.awaitLeader(0, 30*time.Second, "")
	e.awaitReady(30*time.Second, slots...)
	return e.leader()
}

// leader is the one live term; it fails the test unless exactly one process
// leads and it is the lease's holder under the same epoch.
func (e *env) leader() term {
	e.t.Helper()
	live := e.liveTerms()
	if len(live) != 1 {
		e.t.Fatalf("%d live terms, want exactly one: %v", len(live), live)
	}
	id, epoch, held, err := e.holder()
	if err != nil {
		e.t.Fatalf("reading the lease: %v", err)
	}
	if !held || id != live[0].id || epoch != live[0].epoch {
		e.t.Fatalf("the lease is held=%v by %q at epoch %d, but %v leads", held, id, epoch, live[0])
	}
	return live[0]
}

// startLed starts the workload (five ConfigMaps, one updated every 150 ms)
// and operators 1, 2 and 3, and waits for the leader's first write.
func (e *env) startLed() (*workload, term) {
	e.t.Helper()
	w := e.startWorkload(5, 150*time.Millisecond)
	l := e.startOperators(1, 2, 3)
	e.awaitWrite(0, 10*time.Second, l.id, l.epoch, "")
	return w, l
}

func (e *env) awaitWrite(from int, within time.Duration, id string, epoch int64, resource string) opEvent {
	e.t.Helper()
	return e.await(from, within, fmt.Sprintf("write by %s@%d %s", id, epoch, resource), func(ev opEvent) bool {
		return ev.Event == "write" && ev.ID == id && ev.Epoch == epoch && (resource == "" || ev.Resource == resource)
	})
}

// awaitTermEnd waits until the process id stops leading under epoch: its
// epoch-end, or its exit (client-go may give up, and the manager exit,
// before the term's own deadline).
func (e *env) awaitTermEnd(from int, within time.Duration, id string, epoch int64) opEvent {
	e.t.Helper()
	return e.await(from, within, fmt.Sprintf("the end of term %s@%d", id, epoch), func(ev opEvent) bool {
		return ev.ID == id && (ev.Event == "epoch-end" && ev.Epoch == epoch || ev.Event == "exit")
	})
}

func (e *env) awaitExit(p *opProc, within time.Duration) {
	e.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		e.t.Fatalf("%s did not exit within %v", p.id, within)
	}
}

// (a) One leader, the lease's holder; only it writes, under its epoch.
func scenarioSteady(e *env) {
	t := e.t
	w, l := e.startLed()
	for range 10 {
		if got := e.leader(); got != l {
			t.Fatalf("leader changed in steady state: %v, then %v", l, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.verify(w)
	if n := len(e.terms()); n != 1 {
		t.Errorf("%d terms in steady state, want 1", n)
	}
	for _, a := range e.audit() {
		if a.writer != l.id || a.epoch != l.epoch {
			t.Errorf("write of %s by %s@%d, want only the leader %s@%d", a.resource, a.writer, a.epoch, l.id, l.epoch)
		}
	}
	t.Logf("steady state: %v led alone; every write carried epoch %d", l, l.epoch)
}

// (b) SIGKILL of the leader: a follower takes over within the TTL plus
// client-go's retries, with a higher epoch.
func scenarioKill(e *env) {
	t := e.t
	w, l := e.startLed()
	l = e.leader()
	m := e.mark()
	killed := e.signal(e.procByID(l.id), syscall.SIGKILL)
	next := e.awaitLeader(m, 3*ttl, l.id)
	took := next.Time.Sub(killed)
	e.h.timings.add(e.lock, "takeover, leader SIGKILLed (signal → grant)", took)
	t.Logf("takeover: %s killed at %s, %s granted epoch %d at %s: %v (bound %v)", l.id, killed.Format("15:04:05.000"),
		next.ID, next.Epoch, next.Time.Format("15:04:05.000"), took.Round(time.Millisecond), takeoverBound)
	if next.Epoch <= l.epoch {
		t.Errorf("new leader's epoch %d is not above the killed leader's %d", next.Epoch, l.epoch)
	}
	if took > takeoverBound {
		t.Errorf("takeover took %v, more than TTL + client-go's retries (%v)", took, takeoverBound)
	}
	e.awaitWrite(m, 10*time.Second, next.ID, next.Epoch, "")
	e.awaitReady(30*time.Second, 1, 2, 3) // the killed one restarted
	e.verify(w)
}

// (c) The leader is frozen (SIGSTOP) with a write decided but not sent,
// past its TTL: a follower takes over and writes; thawed, the old leader
// sends its write, which the store rejects, and it stops leading and exits.
func scenarioFrozen(e *env) {
	t := e.t
	w, l := e.startLed()
	l = e.leader()
	old := e.procByID(l.id)
	res := e.name + "/cm-0"

	m := e.mark()
	w.update("cm-0", map[string]string{"frozen": "yes"},
		map[string]string{"pglease.example/stall": "2s", "pglease.example/stall-writer": l.id})
	held := e.await(m, 10*time.Second, "the leader holding back its write of "+res, func(ev opEvent) bool {
		return ev.Event == "stall" && ev.ID == l.id && ev.Resource == res
	})
	frozen := e.signal(old, syscall.SIGSTOP)
	next := e.awaitLeader(m, 3*ttl, l.id)
	e.h.timings.add(e.lock, "takeover, leader SIGSTOPped (signal → grant)", next.Time.Sub(frozen))
	if next.Epoch <= l.epoch {
		t.Fatalf("new leader's epoch %d is not above the frozen leader's %d", next.Epoch, l.epoch)
	}
	e.awaitWrite(m, 10*time.Second, next.ID, next.Epoch, res)
	thawed := e.signal(old, syscall.SIGCONT)
	t.Logf("%s frozen for %v (TTL %v) with its write of %s@%s under epoch %d pending; %s took over with epoch %d after %v",
		l.id, thawed.Sub(frozen).Round(time.Millisecond), ttl, res, held.RV, held.Epoch, next.ID, next.Epoch,
		next.Time.Sub(frozen).Round(time.Millisecond))

	stale := e.await(m, 10*time.Second, "the store rejecting the thawed leader's write", func(ev opEvent) bool {
		return ev.Event == "stale" && ev.ID == l.id && ev.Resource == res
	})
	if stale.Epoch != l.epoch || stale.Highest < next.Epoch {
		t.Errorf("rejection %v: want epoch %d refused after epoch >= %d", stale, l.epoch, next.Epoch)
	}
	ended := e.await(m, 10*time.Second, "the thawed leader's term end", func(ev opEvent) bool {
		return ev.Event == "epoch-end" && ev.ID == l.id && ev.Epoch == l.epoch
	})
	e.awaitExit(old, 15*time.Second)
	if old.exitCode != 1 {
		t.Errorf("%s exited with %d after losing the leadership, want 1", l.id, old.exitCode)
	}
	t.Logf("after SIGCONT at %s: term %d ended at %s, write rejected at %s (%v), process exited with %d at %s",
		thawed.Format("15:04:05.000"), l.epoch, ended.Time.Format("15:04:05.000"), stale.Time.Format("15:04:05.000"),
		stale, old.exitCode, old.exitAt.Format("15:04:05.000"))
	for _, a := range e.audit() {
		if a.writer == l.id && a.resource == res && a.rv == held.RV {
			t.Errorf("the store accepted the frozen leader's held-back write: %+v", a)
		}
	}
	e.awaitReady(30*time.Second, 1, 2, 3)
	e.verify(w)
}

// (d) PostgreSQL stopped for longer than the TTL, then crashed (SIGKILL)
// and started again at once, while a leader holds: never two leaders,
// epochs never go down, and the operators recover by themselves (the test
// only restarts those that exited, as a Deployment would).
func scenarioPostgres(e *env) {
	t := e.t
	w, l := e.startLed()
	l = e.leader()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()

	m := e.mark()
	stopped := time.Now()
	if err := e.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 500*time.Millisecond)
	restarted := time.Now()
	if err := e.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL stopped at %s, started at %s (%v down)", stopped.Format("15:04:05.000"),
		restarted.Format("15:04:05.000"), time.Since(stopped).Round(time.Millisecond))
	ended := e.awaitTermEnd(m, 10*time.Second, l.id, l.epoch)
	if !ended.Time.Before(restarted) {
		t.Errorf("%s's term %d ended at %s, after PostgreSQL came back; it could not renew since %s",
			l.id, l.epoch, ended.Time.Format("15:04:05.000"), stopped.Format("15:04:05.000"))
	}
	next := e.awaitLeader(m, 30*time.Second, "")
	if next.Epoch <= l.epoch {
		t.Errorf("leader after the restart has epoch %d, not above %d", next.Epoch, l.epoch)
	}
	e.awaitWrite(m, 20*time.Second, next.ID, next.Epoch, "")
	t.Logf("stop: %s's term ended (%s) at %s (%v after the stop); %s leads with epoch %d from %s",
		l.id, ended.Event, ended.Time.Format("15:04:05.000"), ended.Time.Sub(stopped).Round(time.Millisecond),
		next.ID, next.Epoch, next.Time.Format("15:04:05.000"))

	e.awaitReady(30*time.Second, 1, 2, 3)
	l = e.leader()
	m = e.mark()
	crashed := time.Now()
	if err := e.pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := e.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	recovered := time.Now()
	t.Logf("PostgreSQL crashed at %s, recovered at %s", crashed.Format("15:04:05.000"), recovered.Format("15:04:05.000"))
	after := e.await(m, 30*time.Second, "a write after the crash", func(ev opEvent) bool {
		return ev.Event == "write" && ev.Epoch >= l.epoch && ev.Time.After(recovered)
	})
	_, epoch, _, err := e.holder()
	if err != nil {
		t.Fatal(err)
	}
	if epoch < l.epoch {
		t.Errorf("epoch %d after crash recovery, below %d before", epoch, l.epoch)
	}
	t.Logf("crash: writes resumed at %s by %s under epoch %d (epoch before the crash: %d)",
		after.Time.Format("15:04:05.000"), after.ID, after.Epoch, l.epoch)

	e.awaitReady(30*time.Second, 1, 2, 3)
	var exits []string
	e.mu.Lock()
	for _, p := range e.procs {
		if !p.exitAt.IsZero() {
			exits = append(exits, fmt.Sprintf("%s (status %d at %s)", p.id, p.exitCode, p.exitAt.Format("15:04:05.000")))
		}
	}
	e.mu.Unlock()
	t.Logf("operators that exited and were restarted: %s", strings.Join(exits, ", "))
	e.verify(w)
}

// (e) Rolling restart, twice over: SIGTERM one process at a time, each
// replaced (and ready) before the next. The leader releases its lease when it stops (release on
// cancel), so each handoff takes a follower's retry, not the TTL.
func scenarioRolling(e *env) {
	t := e.t
	w, l := e.startLed()
	handoffs := 0
	// Two rounds, so that the leader is restarted more than once.
	for i := range 6 {
		slot := i%3 + 1
		l = e.leader()
		p := e.proc(slot)
		m := e.mark()
		termed := e.signal(p, syscall.SIGTERM)
		e.awaitExit(p, 20*time.Second)
		if p.exitCode != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", p.id, p.exitCode)
		}
		if p.id == l.id {
			released := e.await(m, 10*time.Second, "the release", func(ev opEvent) bool {
				return ev.Event == "epoch-end" && ev.ID == l.id && ev.Epoch == l.epoch
			})
			next := e.awaitLeader(m, 3*ttl, l.id)
			handoff := next.Time.Sub(termed)
			e.h.timings.add(e.lock, "handoff, leader SIGTERMed (signal → grant)", handoff)
			e.h.timings.add(e.lock, "handoff, of which release → grant", next.Time.Sub(released.Time))
			t.Logf("handoff: SIGTERM to %s at %s, released epoch %d at %s, %s granted epoch %d at %s: %v (TTL %v)",
				p.id, termed.Format("15:04:05.000"), l.epoch, released.Time.Format("15:04:05.000"),
				next.ID, next.Epoch, next.Time.Format("15:04:05.000"), handoff.Round(time.Millisecond), ttl)
			if handoff >= ttl/2 {
				t.Errorf("handoff took %v, not well below the TTL (%v): was the lease released?", handoff, ttl)
			}
			if next.Epoch <= l.epoch {
				t.Errorf("epoch %d after the handoff, not above %d", next.Epoch, l.epoch)
			}
			e.awaitWrite(m, 10*time.Second, next.ID, next.Epoch, "")
			handoffs++
		}
		deadline := time.Now().Add(20 * time.Second)
		for e.proc(slot) == p {
			if time.Now().After(deadline) {
				t.Fatalf("slot %d not restarted", slot)
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.awaitReady(30*time.Second, slot)
	}
	if handoffs == 0 {
		t.Fatal("no handoff: the leader was never restarted")
	}
	e.leader()
	e.verify(w)
}

// (f) The leader is cut off from PostgreSQL by a loopback TCP proxy (the
// robustness suite's: its connections closed, new ones blackholed): its term ends before its grant
// expires on the server, and another process takes over after the expiry.
func scenarioPartition(e *env) {
	t := e.t
	direct := "127.0.0.1:" + strconv.Itoa(e.pg.Port())
	proxy, err := robustness.NewProxy(direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	via := "127.0.0.1:" + strconv.Itoa(proxy.Port())
	e.dsnFor = func(slot int) (string, string) {
		if slot != 1 {
			return e.leaseDSN, e.storeDSN
		}
		return strings.Replace(e.leaseDSN, direct, via, 1), strings.Replace(e.storeDSN, direct, via, 1)
	}
	w := e.startWorkload(5, 150*time.Millisecond)
	// op1, behind the proxy, starts alone so that it leads.
	l := e.startOperators(1)
	if l.id != "op1" {
		t.Fatalf("%v leads, want op1", l)
	}
	e.run(2)
	e.run(3)
	e.awaitReady(30*time.Second, 2, 3)
	e.awaitWrite(0, 10*time.Second, l.id, l.epoch, "")
	l = e.leader()
	old := e.procByID(l.id)

	m := e.mark()
	cut := time.Now()
	proxy.Blackhole() // new connections (and any byte) go nowhere...
	proxy.Cut()       // ...and the open ones are closed
	t.Logf("%s cut off from PostgreSQL at %s", l.id, cut.Format("15:04:05.000"))
	ended := e.awaitTermEnd(m, 3*ttl, l.id, l.epoch)
	next := e.awaitLeader(m, 3*ttl, l.id)
	var expiry time.Time
	for _, s := range e.allSamples() {
		if s.held && s.owner == l.id && s.epoch == l.epoch {
			expiry = s.expiresAt
		}
	}
	if expiry.IsZero() {
		t.Fatal("the test never saw the cut-off leader's grant")
	}
	t.Logf("%s's term %d ended (%s) at %s, %v after the cut and %v before its grant expired on the server (%s); "+
		"%s granted epoch %d at %s", l.id, l.epoch, ended.Event, ended.Time.Format("15:04:05.000"),
		ended.Time.Sub(cut).Round(time.Millisecond), expiry.Sub(ended.Time).Round(time.Millisecond),
		expiry.Format("15:04:05.000"), next.ID, next.Epoch, next.Time.Format("15:04:05.000"))
	e.h.timings.add(e.lock, "leader cut off: cut → its term ends", ended.Time.Sub(cut))
	e.h.timings.add(e.lock, "leader cut off: its term end → server expiry", expiry.Sub(ended.Time))
	e.h.timings.add(e.lock, "takeover, leader cut off (cut → grant)", next.Time.Sub(cut))
	if !ended.Time.Before(expiry) {
		t.Errorf("%s still led at %s, when its grant expired on the server", l.id, expiry.Format("15:04:05.000"))
	}
	if next.Time.Before(expiry) || next.Epoch <= l.epoch {
		t.Errorf("successor %v before the expiry %s or without a higher epoch than %d", next, expiry.Format("15:04:05.000"), l.epoch)
	}
	e.awaitWrite(m, 10*time.Second, next.ID, next.Epoch, "")
	e.awaitExit(old, 20*time.Second)
	if old.exitCode != 1 {
		t.Errorf("%s exited with %d after losing the leadership, want 1", l.id, old.exitCode)
	}
	proxy.Open()
	e.awaitReady(30*time.Second, 1, 2, 3)
	e.verify(w)
}

package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
)

// Rollout systems: client-go's Lease lock, pg_lease without handover, and
// pg_lease handing over to the ready candidate of the newest version.
const (
	rolloutLeaseLock = "lease-lock"
	rolloutPgLease   = "pglease"
	rolloutHandover  = "pglease-handover"
)

// rolloutTimings are client-go's and controller-runtime's defaults: no
// rollout waits for an expiry, so they set only how often a Lease follower
// retries.
const (
	rolloutTTL           = 15 * time.Second
	rolloutRenewDeadline = 10 * time.Second
	rolloutRetryPeriod   = 2 * time.Second
)

// TestRollout runs rolling updates of a 3-replica examples/operator on the
// real kube-apiserver, as a Deployment with maxSurge 1 and maxUnavailable 0
// does them: a new-version replica is started and becomes ready, then one
// old replica is stopped (SIGTERM) and exits, three times. The leader is
// stopped first, second and third in turn. Between a replica's readiness
// and the next stop lies a random settle time, the same sequence for every
// system: the kubelet marks a pod ready at its next readiness probe
// (every 10 s by default), so the new replica's elector may be anywhere in
// its retry cycle when the old one stops. The Deployment creates the next
// new pod as it deletes the old one, and its process starts a container
// start later: here 1 to 3 s after the stop, also random and the same for
// every system.
//
// It checks, whatever the system: never two leaders, the store's fencing
// audit (env.verify), and a new-version leader at the end. With handover it
// also checks that every rollout moved the leadership exactly once, to a
// new-version replica whose caches had synced. The numbers (leader changes
// and leaderless time per rollout) are printed, never asserted.
//
// By default only pglease-handover runs, two rollouts, settle times below
// 1 s. PGLEASE_ROLLOUTS=N runs N rollouts of each system, settle times
// below 10 s, and prints one line per system:
//
//	rollout: SYSTEM leader-changes/rollout X leaderless/rollout Y ms (n=N)
//
// PGLEASE_ROLLOUT_SETTLE=D bounds the settle times by D instead (bench/run.sh
// smoke: 1s, so that a tiny run of every system stays short).
func TestRollout(t *testing.T) {
	n, systems, maxSettle := 2, []string{rolloutHandover}, time.Second
	if v := os.Getenv("PGLEASE_ROLLOUTS"); v != "" {
		maxSettle = 10 * time.Second
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("PGLEASE_ROLLOUTS=%q: want a positive number of rollouts per system", v)
		}
		systems = []string{rolloutLeaseLock, rolloutPgLease, rolloutHandover}
	}
	if v := os.Getenv("PGLEASE_ROLLOUT_SETTLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("PGLEASE_ROLLOUT_SETTLE=%q: want a positive duration", v)
		}
		maxSettle = d
	}
	h := newHarness(t)
	var summary []string
	for _, sys := range systems {
		t.Run(sys, func(t *testing.T) {
			summary = append(summary, rolloutSystem(t, h, sys, n, maxSettle))
		})
	}
	t.Logf("rollouts (TTL %v, RenewDeadline %v, RetryPeriod %v, settle times below %v):\n%s", rolloutTTL,
		rolloutRenewDeadline, rolloutRetryPeriod, maxSettle, strings.Join(summary, "\n"))
}

// rolloutResult is what one rollout did to the leadership.
type rolloutResult struct {
	changes    int           // terms started during the rollout
	leaderless time.Duration // summed gaps between a term's end and the next one's start
	toOld      int           // changes to a replica of the old version
	toUnsynced int           // changes to a replica whose caches had not synced
	leaders    []string      // who led, in order, the one before the rollout first
}

func rolloutSystem(t *testing.T, h *harness, sys string, n int, maxSettle time.Duration) string {
	lock := "pglease"
	if sys == rolloutLeaseLock {
		lock = "lease"
	}
	e := h.newEnv(t, lock, "rollout-"+sys)
	e.ld, e.rd, e.rp = rolloutTTL, rolloutRenewDeadline, rolloutRetryPeriod
	// Every system's followers keep warm caches: synced means the same.
	e.args = []string{"-warmup"}
	version := map[int]string{} // slot -> version; written before each start
	e.extraArgs = func(slot int) []string {
		args := []string{"-leader-elect-version", version[slot]}
		if sys == rolloutHandover {
			args = append(args, "-leader-elect-handover", "newest-version")
		}
		return args
	}
	versionOf := func(r int) string { return fmt.Sprintf("1.%d.0", r) }

	w := e.startWorkload(5, 150*time.Millisecond)
	pods := []int{1, 2, 3}
	for _, s := range pods {
		version[s] = versionOf(0)
		if _, err := e.start(s); err != nil {
			t.Fatal(err)
		}
	}
	e.awaitLeader(0, 30*time.Second, "")
	e.awaitReady(30*time.Second, pods...)
	next := 4
	var results []rolloutResult
	for r := range n {
		res := e.rollout(sys, r, &pods, &next, version, versionOf(r+1), maxSettle)
		t.Logf("rollout %d (%s -> %s): %d leader change(s) %v, leaderless %v, to old version %d, to unsynced %d",
			r+1, versionOf(r), versionOf(r+1), res.changes, res.leaders, res.leaderless.Round(10*time.Microsecond),
			res.toOld, res.toUnsynced)
		results = append(results, res)
	}
	e.verify(w)

	var changes, toOld, toUnsynced int
	var leaderless, worst time.Duration
	for _, res := range results {
		changes += res.changes
		toOld += res.toOld
		toUnsynced += res.toUnsynced
		leaderless += res.leaderless
		worst = max(worst, res.leaderless)
	}
	line := fmt.Sprintf("rollout: %s leader-changes/rollout %.2f leaderless/rollout %.1f ms (n=%d)", sys,
		float64(changes)/float64(n), float64(leaderless.Microseconds())/1000/float64(n), n)
	fmt.Println(line)
	detail := fmt.Sprintf("%s   (changes to an old-version replica %d of %d, to an unsynced one %d; worst rollout leaderless %.1f ms)",
		line, toOld, changes, toUnsynced, float64(worst.Microseconds())/1000)
	t.Log(detail)
	return detail
}

// rollout replaces the replicas *pods (all of one version) with replicas
// of version to, one at a time: start a new one, wait until it is ready
// (and, with handover, registered as a ready candidate on the server),
// settle, stop an old one and wait for its exit. The leader is stopped at
// position r%3.
func (e *env) rollout(sys string, r int, pods *[]int, next *int, version map[int]string, to string,
	maxSettle time.Duration) rolloutResult {
	t := e.t
	t.Helper()
	before := e.leader()
	old := slices.Clone(*pods)
	var order []int
	for _, s := range old {
		if e.proc(s).id != before.id {
			order = append(order, s)
		}
	}
	leaderSlot := -1
	for _, s := range old {
		if e.proc(s).id == before.id {
			leaderSlot = s
		}
	}
	if leaderSlot < 0 || len(order) != 2 {
		t.Fatalf("the leader %v is not one of the replicas %v", before, old)
	}
	order = slices.Insert(order, r%3, leaderSlot)
	var added []int
	rng := rand.New(rand.NewPCG(uint64(r), 0)) // the same for every system
	var stopped time.Time
	for _, s := range order {
		if !stopped.IsZero() {
			startDelay := time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
			time.Sleep(time.Until(stopped.Add(startDelay)))
		}
		ns := *next
		*next++
		version[ns] = to
		if _, err := e.start(ns); err != nil {
			t.Fatal(err)
		}
		added = append(added, ns)
		e.awaitReady(60*time.Second, ns)
		if sys == rolloutHandover {
			e.awaitCandidateReady(30*time.Second, e.proc(ns).id)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(maxSettle))))
		p := e.proc(s)
		stopped = e.signal(p, syscall.SIGTERM)
		e.awaitExit(p, 30*time.Second)
		if p.exitCode != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", p.id, p.exitCode)
		}
	}
	*pods = added
	newIDs := map[string]bool{}
	for _, s := range added {
		newIDs[e.proc(s).id] = true
	}
	// The last old replica may have led: wait for its successor.
	deadline := time.Now().Add(3 * rolloutTTL)
	for {
		live := e.liveTerms()
		if len(live) == 1 && newIDs[live[0].id] {
			break
		}
		if len(live) > 1 {
			t.Fatalf("two leaders: %v", live)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new-version leader %v after the rollout; live terms %v", slices.Sorted(maps.Keys(newIDs)), live)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := e.leader()

	synced := map[string]time.Time{}
	for _, ev := range e.allEvents() {
		if ev.Event == "synced" {
			if _, ok := synced[ev.ID]; !ok {
				synced[ev.ID] = ev.Time
			}
		}
	}
	res := rolloutResult{leaders: []string{before.id}}
	terms := e.terms()
	for i, tm := range terms {
		if tm.epoch <= before.epoch || tm.epoch > after.epoch {
			continue
		}
		prev := terms[i-1]
		if prev.end.IsZero() {
			t.Fatalf("two leaders: %v started while %v led", tm, prev)
		}
		res.changes++
		res.leaderless += tm.start.Sub(prev.end)
		res.leaders = append(res.leaders, tm.id)
		if !newIDs[tm.id] {
			res.toOld++
		}
		if at, ok := synced[tm.id]; !ok || at.After(tm.start) {
			res.toUnsynced++
		}
	}
	if sys == rolloutHandover && (res.changes != 1 || res.toOld != 0 || res.toUnsynced != 0) {
		t.Errorf("handover: the rollout moved the leadership %d time(s) (%v), %d to an old-version replica, "+
			"%d to one whose caches had not synced; want once, to a synced new-version replica",
			res.changes, res.leaders, res.toOld, res.toUnsynced)
	}
	return res
}

// awaitCandidateReady waits until the server lists id as a live, ready
// candidate of the key.
func (e *env) awaitCandidateReady(within time.Duration, id string) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		_, cands, err := handover.Candidates(ctx, e.leases, e.name)
		cancel()
		if err == nil && slices.ContainsFunc(cands, func(c handover.CandidateState) bool {
			return c.Owner == id && c.Live && c.Ready
		}) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not a ready candidate of %s within %v (last error %v, candidates %+v)", id, e.name, within, err, cands)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

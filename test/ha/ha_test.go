package ha

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/patroni"
	"github.com/pglease/pg_lease/internal/pgtest"
)

// The fault kinds, in the order they run.
const (
	faultSwitchover = "switchover" // patronictl switchover to a replica
	faultCrash      = "crash"      // SIGKILL of the primary's Patroni and postmaster
	faultFreeze     = "freeze"     // the primary's node SIGSTOPped while another is promoted
	faultBackForth  = "back-forth" // switchover A→B, then at once B→A
)

var faults = []string{faultSwitchover, faultCrash, faultFreeze, faultBackForth, faultEtcd, faultMidCommit}

// optInFaults run only when PGLEASE_HA_FAULTS names them: faultPatroni
// breaks the database's own guarantee under Patroni 3.0.2 (README.md).
var optInFaults = []string{faultPatroni}

// sample is one failover: how long Patroni took (from the fault to the new
// primary accepting writes) and how long every key then stayed without a
// fenced write on the new primary.
type sample struct {
	promotion, leaderless time.Duration
	parts                 []part // the breakdown, from the promotion on
	cut                   int    // faultMidCommit: the candidates' calls the switchover cut
}

// failovers is how many failovers of each kind run in mode m:
// $PGLEASE_HA_ROUNDS (every mode), else 10 in strict mode and 2 in the
// others. A back-and-forth round makes two.
func failovers(t *testing.T, m patroni.Mode) int {
	if v := os.Getenv("PGLEASE_HA_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("PGLEASE_HA_ROUNDS=%q: want a positive integer", v)
		}
		return n
	}
	if m == patroni.Strict {
		return 10
	}
	return 2
}

// modes is $PGLEASE_HA_MODES (comma-separated), else all three.
func modes(t *testing.T) []patroni.Mode {
	all := []patroni.Mode{patroni.Async, patroni.Sync, patroni.Strict}
	v := os.Getenv("PGLEASE_HA_MODES")
	if v == "" {
		return all
	}
	var out []patroni.Mode
	for _, s := range strings.Split(v, ",") {
		m := patroni.Mode(strings.TrimSpace(s))
		if !slices.Contains(all, m) {
			t.Fatalf("PGLEASE_HA_MODES: unknown mode %q (async, sync, strict)", m)
		}
		out = append(out, m)
	}
	return out
}

// TestPatroni runs, per mode, one Patroni cluster with every kind of
// elector on it and every fault kind repeated, then checks the whole run:
// one leader at a time, no (key, epoch) granted twice, epochs strictly
// increasing per key, and in the synchronous modes every acknowledged
// change present after the failovers. It prints one line per mode and
// fault kind with the leaderless time after Patroni's promotion.
func TestPatroni(t *testing.T) {
	var lines []string
	for _, mode := range modes(t) {
		t.Run(string(mode), func(t *testing.T) {
			lines = append(lines, runMode(t, mode)...)
		})
	}
	for _, l := range lines {
		fmt.Println(l)
	}
}

func runMode(t *testing.T, mode patroni.Mode) []string {
	w := newWorld(t, mode)
	w.startElectors(3)
	w.startClientGo(3)
	w.startOperators(3)
	w.ledger = startLedger(w)

	ctx := pgtest.Context(t, 15*time.Minute)
	// Steady state first: every key led and written on the primary.
	leader, err := w.c.WaitHealthy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.awaitWrites(withTimeout(ctx, time.Minute), time.Time{}, leader.Port); err != nil {
		t.Fatalf("no leader before any fault: %v", err)
	}

	n := failovers(t, mode)
	results := map[string][]sample{}
	windows := map[string][]window{}
	chosen := selectedFaults(t)
	for _, fault := range chosen {
		for i := 1; len(results[fault]) < n; i++ {
			start := time.Now()
			got, err := w.inject(ctx, fault)
			if err != nil {
				t.Fatalf("%s %s round %d: %v", mode, fault, i, err)
			}
			results[fault] = append(results[fault], got...)
			windows[fault] = append(windows[fault], window{start, time.Now()})
			t.Logf("%s %s round %d: %v in all, from %s", mode, fault, i, time.Since(start).Round(100*time.Millisecond), start.Format("15:04:05.000"))
		}
	}
	w.shutdown()
	w.check(ctx)

	var lines []string
	for _, fault := range chosen {
		lines = append(lines, line(mode, fault, results[fault], w.safety(windows[fault])))
		lines = append(lines, partLines(fmt.Sprintf("  after promotion: %s %s", mode, fault), results[fault])...)
	}
	for _, l := range lines {
		t.Log(l)
	}
	return lines
}

func withTimeout(ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	context.AfterFunc(c, cancel)
	return c
}

// inject runs one fault of the kind given on a healthy cluster whose keys
// are all led, measures each failover it causes, and returns once the
// cluster is healthy again.
func (w *world) inject(ctx context.Context, fault string) (_ []sample, err error) {
	old, err := w.c.WaitHealthy(withTimeout(ctx, 2*time.Minute))
	if err != nil {
		return nil, err
	}
	switch fault {
	case faultSwitchover:
		s, _, err := w.switchover(ctx, old)
		return []sample{s}, err
	case faultBackForth:
		// Patroni switches over only to the synchronous standby in the
		// synchronous modes. The third node is tagged nosync for the
		// round, so that the old primary becomes the standby to switch
		// back to (in strict mode the new primary's commits wait for it).
		var third *patroni.Node
		if w.mode != patroni.Async {
			if third, err = w.third(ctx, old); err != nil {
				return nil, err
			}
			if err := third.SetTags(map[string]any{"nosync": true}); err != nil {
				return nil, err
			}
			defer func() { err = joinErr(err, third.SetTags(nil)) }()
		}
		s1, next, err := w.switchover(ctx, old)
		if err != nil {
			return nil, err
		}
		// Back as soon as Patroni allows it: the old primary has rejoined
		// (as the synchronous standby in the synchronous modes).
		if err := w.awaitStandby(ctx, old); err != nil {
			return nil, err
		}
		s2, _, err := w.switchoverTo(ctx, next, old)
		return []sample{s1, s2}, err
	case faultCrash, faultFreeze:
		t0 := time.Now()
		if fault == faultCrash {
			err = old.Kill()
		} else {
			err = old.Freeze()
		}
		if err != nil {
			return nil, err
		}
		// The old primary comes back as a replica: a crashed one as soon as
		// another is promoted (while the keys wait for a leader), a frozen
		// one once the keys have theirs. A frozen node is killed, not
		// thawed: Patroni 3.0.2 (Debian 12), thawed after its leader key
		// expired, writes the key again without comparing it (fixed in
		// Patroni 3.0.3), so the promoted node is demoted and its
		// acknowledged commits are rewound away.
		var restart func() error
		if fault == faultCrash {
			restart = func() error { return old.Start(withTimeout(ctx, 2*time.Minute)) }
		}
		s, _, err := w.measure(ctx, t0, old, restart)
		if fault == faultFreeze {
			err = joinErr(err, old.Kill())
			err = joinErr(err, old.Start(withTimeout(ctx, 2*time.Minute)))
		}
		if err != nil {
			return nil, err
		}
		_, err = w.c.WaitHealthy(withTimeout(ctx, 3*time.Minute))
		return []sample{s}, err
	case faultEtcd:
		s, err := w.etcdLost(ctx, old)
		return []sample{s}, err
	case faultPatroni:
		s, err := w.patroniKilled(ctx, old)
		return []sample{s}, err
	case faultMidCommit:
		s, err := w.midCommit(ctx, old)
		return []sample{s}, err
	}
	return nil, fmt.Errorf("unknown fault %q", fault)
}

// third is the node that is neither old nor the synchronous standby.
func (w *world) third(ctx context.Context, old *patroni.Node) (*patroni.Node, error) {
	ms, err := w.c.Members(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Name != old.Name && m.Role != "sync_standby" {
			return w.c.Node(m.Name), nil
		}
	}
	return nil, fmt.Errorf("no third node besides %s and the synchronous standby: %+v", old.Name, ms)
}

// awaitStandby waits until the cluster is healthy with n streaming (and,
// in the synchronous modes, as the synchronous standby).
func (w *world) awaitStandby(ctx context.Context, n *patroni.Node) error {
	ctx = withTimeout(ctx, 2*time.Minute)
	for {
		if _, err := w.c.WaitHealthy(ctx); err != nil {
			return err
		}
		if w.mode == patroni.Async {
			return nil
		}
		ms, err := w.c.Members(ctx)
		if err == nil {
			for _, m := range ms {
				if m.Name == n.Name && m.Role == "sync_standby" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not become the synchronous standby: %+v (%v)", n.Name, ms, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func joinErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// switchover moves the primary from old to a replica Patroni accepts (the
// synchronous standby in the synchronous modes).
func (w *world) switchover(ctx context.Context, old *patroni.Node) (sample, *patroni.Node, error) {
	cand, err := w.candidate(ctx, old)
	if err != nil {
		return sample{}, nil, err
	}
	return w.switchoverTo(ctx, old, cand)
}

// candidate is a replica Patroni accepts to switch over to from old.
func (w *world) candidate(ctx context.Context, old *patroni.Node) (*patroni.Node, error) {
	ms, err := w.c.Members(ctx)
	if err != nil {
		return nil, err
	}
	var cand *patroni.Node
	for _, m := range ms {
		if m.Name == old.Name {
			continue
		}
		if w.mode == patroni.Async || m.Role == "sync_standby" {
			cand = w.c.Node(m.Name)
			break
		}
	}
	if cand == nil {
		return nil, fmt.Errorf("no switchover candidate among %+v", ms)
	}
	return cand, nil
}

func (w *world) switchoverTo(ctx context.Context, old, cand *patroni.Node) (sample, *patroni.Node, error) {
	t0 := time.Now()
	if err := w.c.Switchover(withTimeout(ctx, 2*time.Minute), old, cand); err != nil {
		return sample{}, nil, err
	}
	s, next, err := w.measure(ctx, t0, old, nil)
	if err == nil && next != cand {
		err = fmt.Errorf("switchover to %s promoted %s", cand.Name, next.Name)
	}
	return s, next, err
}

// measure waits for the promotion of a node other than old after t0, then
// for a fenced write of every key on it. It runs afterPromotion (if not
// nil) in between, while the keys wait.
func (w *world) measure(ctx context.Context, t0 time.Time, old *patroni.Node, afterPromotion func() error) (sample, *patroni.Node, error) {
	p, err := w.probe.await(withTimeout(ctx, 2*time.Minute), t0, old)
	if err != nil {
		return sample{}, nil, err
	}
	s, err := w.measureFrom(ctx, t0, old, p, afterPromotion)
	return s, p.node, err
}

// measureFrom waits, after promotion p, for a fenced write of every key on
// the node promoted; see measure.
func (w *world) measureFrom(ctx context.Context, t0 time.Time, old *patroni.Node, p promotion, afterPromotion func() error) (sample, error) {
	restarted := make(chan error, 1)
	if afterPromotion != nil {
		go func() { restarted <- afterPromotion() }()
	} else {
		restarted <- nil
	}
	got, err := w.awaitWrites(withTimeout(ctx, 2*time.Minute), p.at, p.node.Port)
	err = joinErr(err, <-restarted)
	if err != nil {
		return sample{}, fmt.Errorf("after %s was promoted: %w", p.node.Name, err)
	}
	s := sample{promotion: p.at.Sub(t0)}
	var parts []string
	for _, k := range w.keys {
		d := got[k].at.Sub(p.at)
		s.leaderless = max(s.leaderless, d)
		parts = append(parts, fmt.Sprintf("%s %v (%s epoch %d)", k, d.Round(time.Millisecond), got[k].who, got[k].epoch))
	}
	s.parts = w.breakdown(t0, old.Name, p, got)
	w.t.Logf("%s -> %s: promoted %v after the fault; first fenced writes: %s; after the promotion: %s",
		old.Name, p.node.Name, s.promotion.Round(time.Millisecond), strings.Join(parts, ", "), formatParts(s.parts))
	return s, nil
}

// line is the summary of one mode and fault kind.
func line(mode patroni.Mode, fault string, ss []sample, sf safety) string {
	if len(ss) == 0 {
		return fmt.Sprintf("leaderless after failover: %s %s (n=0)", mode, fault)
	}
	cut := 0
	for _, s := range ss {
		cut += s.cut
	}
	extra := ""
	if fault == faultMidCommit {
		extra = fmt.Sprintf(", calls cut mid-commit %d", cut)
	}
	var ll, pp, cc []time.Duration
	for _, s := range ss {
		ll = append(ll, s.leaderless)
		pp = append(pp, s.promotion)
		if d, ok := s.afterCommit(); ok {
			cc = append(cc, d)
		}
	}
	slices.Sort(ll)
	slices.Sort(pp)
	slices.Sort(cc)
	afterCommit := "after the first commit n=0"
	if len(cc) > 0 {
		afterCommit = fmt.Sprintf("after the first commit p50 %.2fs max %.2fs (n=%d)", median(cc).Seconds(), cc[len(cc)-1].Seconds(), len(cc))
	}
	return fmt.Sprintf("leaderless after failover: %s %s p50 %.2fs max %.2fs (n=%d), %s, promotion by Patroni p50 %.2fs; two holders %d, epoch granted twice %d%s",
		mode, fault, median(ll).Seconds(), ll[len(ll)-1].Seconds(), len(ll), afterCommit, median(pp).Seconds(), sf.twoHolders, sf.epochTwice, extra)
}

// afterCommit is how long the keys stayed without a fenced write after the
// new primary's first possible commit (the probe's first commit there):
// pg_lease's and the candidates' share of the leaderless time. false: no
// commit was timed.
func (s sample) afterCommit() (time.Duration, bool) {
	for _, p := range s.parts {
		if p.name == "first commit" {
			return max(s.leaderless-p.d, 0), true
		}
	}
	return 0, false
}

func median(d []time.Duration) time.Duration {
	n := len(d)
	if n%2 == 1 {
		return d[n/2]
	}
	return (d[n/2-1] + d[n/2]) / 2
}

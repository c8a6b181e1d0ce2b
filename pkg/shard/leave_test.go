package shard_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/shard"
)

// stmtGate, on a replica's pool, holds back while closed the statements
// whose SQL contains one of match and, when keyArg is set, whose first
// argument lists that key, whatever their context says; it counts those
// held back per pattern.
type stmtGate struct {
	match  []string
	keyArg string
	mu     sync.Mutex
	closed chan struct{} // nil while open
	held   map[string]int
}

func (g *stmtGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g.mu.Lock()
	closed := g.closed
	var hit string
	for _, m := range g.match {
		if closed != nil && strings.Contains(d.SQL, m) {
			hit = m
		}
	}
	if hit != "" && g.keyArg != "" {
		keys, _ := firstArg(d.Args).([]string)
		if !slices.Contains(keys, g.keyArg) {
			hit = ""
		}
	}
	if hit != "" {
		g.held[hit]++
	}
	g.mu.Unlock()
	if hit != "" {
		<-closed
	}
	return ctx
}

func firstArg(args []any) any {
	if len(args) == 0 {
		return nil
	}
	return args[0]
}

func (g *stmtGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (g *stmtGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *stmtGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// heldAll reports whether a statement of every pattern is held back.
func (g *stmtGate) heldAll() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.match {
		if g.held[m] == 0 {
			return false
		}
	}
	return true
}

// heldBy lists the keys owner holds now.
func heldBy(t *testing.T, lc *lease.Client, owner string) []string {
	t.Helper()
	states, err := lc.List(pgtest.Context(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, st := range states {
		if st.Held && st.Owner == owner {
			out = append(out, st.Key)
		}
	}
	return out
}

// TestLeaveDoesNotWaitForStatementsInFlight: a replica stopped while its
// round's list and its renewal of every key are running (held back on
// their way to the server) hands its shards over at once: the others act
// under them, each handed over by the leaver's release, before either
// statement returns. Once they return, the leaver holds nothing.
func TestLeaveDoesNotWaitForStatementsInFlight(t *testing.T) {
	c := newCluster(t, 16, 10*time.Minute) // no grant lapses during the test
	c.renew = 200 * time.Millisecond
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	gate := &stmtGate{match: []string{"lease.list()", "lease.renew_many("}, held: map[string]int{}}
	defer gate.open()
	c.start("a")
	c.start("c")
	b := c.startTraced("b", gate)
	c.waitSettled("a", "b", "c")
	owners := c.last
	after := shard.Balance(c.n, []string{"a", "c"}, owners)
	c.waitRunnersUp(owners, after, "b")
	bOwner := b.r.Owner()

	// A list holds no lock and b's renewal is held before the server: the
	// release waits for no row.
	gate.close()
	waitFor(t, "b's round list and its renewal held back", gate.heldAll)
	b.cancel(context.Canceled)
	for s := range c.n {
		if owners[s] != "b" {
			continue
		}
		r := c.replicas[after[s]].r
		waitFor(t, fmt.Sprintf("%s acting under shard %d while b's statements are held back", after[s], s), func() bool { return r.Owns(s) })
		h, err := leaseadmin.History(ctx, lc, shard.Key("ctl", s), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 1 || h[0].Kind != "handed_over" || h[0].PreviousOwner != bOwner || h[0].Owner != r.Owner() {
			t.Errorf("shard %d: last history %+v, want handed_over from %s to %s", s, h, bOwner, r.Owner())
		}
	}
	select {
	case <-b.done:
		t.Fatal("b's Run returned while its statements were held back: the gate tested nothing")
	default:
	}
	gate.open()
	<-b.done
	if keys := heldBy(t, lc, bOwner); len(keys) > 0 {
		t.Errorf("b holds %v after its Run returned", keys)
	}
	c.waitSettled("a", "c")
	c.checkNoOverlap()
	if !slices.Equal(c.last, after) {
		t.Errorf("b's shards went to %v, want %v", c.last, after)
	}
}

// TestLeaveReleasesWhatAStatementInFlightTook: a replica stopped while its
// round's acquire of its shards is on its way releases its member key at
// once; the acquire, landing after that, begins no term (no work starts
// under a grant the leaver took) and its grants are released before Run
// returns.
func TestLeaveReleasesWhatAStatementInFlightTook(t *testing.T) {
	c := newCluster(t, 4, 10*time.Minute)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	var mu sync.Mutex
	var began []int
	c.acquired = func(id string, s int) {
		mu.Lock()
		defer mu.Unlock()
		began = append(began, s)
	}
	gate := &stmtGate{match: []string{"LATERAL lease.acquire(u.k"}, keyArg: shard.Key("ctl", 0), held: map[string]int{}}
	defer gate.open()
	gate.close()
	v := c.startTraced("v", gate)
	waitFor(t, "v's acquire of its shards held back", gate.heldAll)
	v.cancel(context.Canceled)
	member := shard.MemberKey("ctl", "v")
	waitFor(t, "v's member key released while its acquire is held back", func() bool {
		st, err := lc.Inspect(ctx, member)
		if err != nil {
			t.Fatal(err)
		}
		return !st.Held
	})
	gate.open()
	<-v.done
	if keys := heldBy(t, lc, v.r.Owner()); len(keys) > 0 {
		t.Errorf("v holds %v after its Run returned", keys)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(began) > 0 || len(v.r.Owned()) > 0 {
		t.Errorf("v began terms of shards %v after its stop (owns %v)", began, v.r.Owned())
	}
	// The acquire did land: its grants were taken and released again.
	for s := range c.n {
		h, err := leaseadmin.History(ctx, lc, shard.Key("ctl", s), 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 2 || h[0].Kind != leaseadmin.HistoryAcquired || h[0].Owner != v.r.Owner() ||
			h[1].Kind != leaseadmin.HistoryReleased || h[1].Owner != v.r.Owner() {
			t.Errorf("shard %d: history %+v, want v's grant and its release", s, h)
		}
	}
}

// TestHandoverNotifiedDuringATakeTakenBesideIt: a handover notified while
// a replica's take of an earlier one runs is taken beside it, in a
// statement of its own sent before the first returns, not after it (the
// notifications of one release reach a Waiter one after another). Member b
// is live but runs no replica; its two shards are released by the test one
// after the other, each handed to v (b's runner-up); v's take of the first
// is held back on its way to the server, and v's rounds are held back
// throughout.
func TestHandoverNotifiedDuringATakeTakenBesideIt(t *testing.T) {
	c := newCluster(t, 4, 10*time.Minute)
	c.renew = 9 * time.Minute
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	want, bs := c.replicaLessMember(ctx, lc, "b")
	if len(bs) != 2 {
		t.Fatalf("the assignment gives b %v, want 2 shards", bs)
	}
	var bts []lease.Token
	for _, s := range bs {
		g, ok, err := lc.Acquire(ctx, shard.Key("ctl", s), "b#0", 10*time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		bts = append(bts, g.Token)
	}
	gate := &renewGate{hold: []string{shard.Key("ctl", bs[0])}}
	defer gate.open()
	rep := c.startTraced("v", gate)
	v := rep.r
	for s, m := range want {
		if m == "v" {
			waitFor(t, fmt.Sprintf("v owning shard %d", s), func() bool { return v.Owns(s) })
		}
	}
	for _, s := range bs {
		waitFor(t, fmt.Sprintf("v registered as the candidate of shard %d", s), func() bool {
			_, cands, err := handover.Candidates(ctx, lc, shard.Key("ctl", s))
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(cands, func(x handover.CandidateState) bool { return x.Owner == v.Owner() && x.Rank == 1 })
		})
	}

	gate.mu.Lock()
	gate.closed = make(chan struct{})
	gate.mu.Unlock()
	if err := lc.Release(ctx, bts[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("v's take of shard %d held back", bs[0]), func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return gate.held == 1
	})
	if err := lc.Release(ctx, bts[1]); err != nil {
		t.Fatal(err)
	}
	second := []string{shard.Key("ctl", bs[1])}
	waitFor(t, fmt.Sprintf("v's take of shard %d sent while its take of shard %d is held back", bs[1], bs[0]), func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return slices.ContainsFunc(gate.renews, func(keys []string) bool { return slices.Equal(keys, second) })
	})
	gate.mu.Lock()
	held := gate.closed != nil && gate.held == 1
	gate.mu.Unlock()
	if !held {
		t.Fatal("the first take was not held back throughout")
	}
	gate.open()
}

// A handover of a shard notified while a statement takes that shard (a
// later epoch of it) is decided after that statement, not dropped: v's take
// of shard bs[0] under a forged notification is held back, a notification
// of a later epoch arrives meanwhile, and once the first take returns
// (refused: no such grant) v sends a statement for the later one too.
func TestHandoverOfAShardBeingTakenDecidedAfterTheTake(t *testing.T) {
	c := newCluster(t, 4, 10*time.Minute)
	c.renew = 9 * time.Minute
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	want, bs := c.replicaLessMember(ctx, lc, "b")
	if len(bs) == 0 {
		t.Fatalf("the assignment gives b no shard")
	}
	gate := &renewGate{hold: []string{shard.Key("ctl", bs[0])}}
	defer gate.open()
	rep := c.startTraced("v", gate)
	v := rep.r
	for s, m := range want {
		if m == "v" {
			waitFor(t, fmt.Sprintf("v owning shard %d", s), func() bool { return v.Owns(s) })
		}
	}
	ln := pgtest.Connect(t, c.dsn)
	if _, err := ln.Exec(ctx, `LISTEN pg_lease`); err != nil {
		t.Fatal(err)
	}
	// notify sends a handover of bs[0] to v at epoch and waits until this
	// test's own listener has it: every listener has it then, v's too.
	notify := func(epoch int64) {
		payload := fmt.Sprintf(`{"event":"handover","key":%q,"owner":%q,"epoch":%d}`, shard.Key("ctl", bs[0]), v.Owner(), epoch)
		if _, err := c.pool.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := ln.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == payload {
				return
			}
		}
	}
	gate.mu.Lock()
	gate.closed = make(chan struct{})
	gate.mu.Unlock()
	notify(1 << 40)
	waitFor(t, fmt.Sprintf("v's take of shard %d held back", bs[0]), func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return gate.held == 1
	})
	notify(1 << 41)
	only := []string{shard.Key("ctl", bs[0])}
	takes := func() int {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		n := 0
		for _, keys := range gate.renews {
			if slices.Equal(keys, only) {
				n++
			}
		}
		return n
	}
	gate.open()
	waitFor(t, fmt.Sprintf("v's statement for the later handover of shard %d after its take", bs[0]), func() bool { return takes() >= 2 })
}

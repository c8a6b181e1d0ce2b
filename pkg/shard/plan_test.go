package shard

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// world is a controller's keys for the plan's table tests: no database.
type world struct {
	n      int
	now    time.Time
	states []lease.State
	exp    []expiry
}

func newWorld(n int) *world { return &world{n: n, now: time.Unix(1000, 0)} }

// member adds a held member key of id, held by owner id#1, expiring in d.
func (w *world) member(id string, d time.Duration) *world {
	w.states = append(w.states, lease.State{Key: MemberKey("ctl", id), Exists: true, Held: true, Owner: id + "#1", Epoch: 1})
	w.exp = append(w.exp, at(w.now.Add(d)))
	return w
}

// at is an expiry at e on both clocks (the model's server clock is the
// local one, the list took no time).
func at(e time.Time) expiry { return expiry{server: e, early: e, late: e} }

// shard adds shard s held by owner ("" free), expiring in d.
func (w *world) shard(s int, owner string, d time.Duration) *world {
	st := lease.State{Key: Key("ctl", s), Exists: true, Held: owner != "", Owner: owner, Epoch: int64(s + 1)}
	w.states = append(w.states, st)
	var e expiry
	if owner != "" {
		e = at(w.now.Add(d))
	}
	w.exp = append(w.exp, e)
	return w
}

// lapsed adds shard s whose grant to owner lapsed: not held, its last
// owner named.
func (w *world) lapsed(s int, owner string) *world {
	w.states = append(w.states, lease.State{Key: Key("ctl", s), Exists: true, Lapsed: true, LastOwner: owner, Epoch: int64(s + 1)})
	w.exp = append(w.exp, expiry{})
	return w
}

// settled adds every shard held as Assign over ids gives it.
func (w *world) settled(ids ...string) *world {
	for s, id := range Assign(w.n, ids) {
		w.shard(s, id+"#1", 10*time.Second)
	}
	return w
}

func (w *world) snap(id string) snapshot {
	return buildSnapshot("ctl", w.n, id, id+"#1", w.states, w.exp, w.now)
}

func (w *world) decide(id string, own map[int]bool) plan {
	return decide(planInput{n: w.n, identity: id, owner: id + "#1", snap: w.snap(id).withSelf(id, id+"#1"),
		own: own, listed: w.now, next: 3 * time.Second, poll: 50 * time.Millisecond, ttl: 10 * time.Second, waiter: true})
}

func ownOf(ids []string, id string) map[int]bool {
	own := map[int]bool{}
	for s, o := range ids {
		if o == id {
			own[s] = true
		}
	}
	return own
}

func shardsOf(assign []string, id string) []int {
	var out []int
	for s, o := range assign {
		if o == id {
			out = append(out, s)
		}
	}
	return out
}

// TestPlanSettled: a replica owning what Balance gives it gives up and
// takes nothing, and registers as runner-up for exactly the shards that
// come to it when another member leaves; the next round is at the renewal
// period or the earliest member expiry.
func TestPlanSettled(t *testing.T) {
	ids := []string{"a", "b", "c"}
	w := newWorld(64).member("a", 9*time.Second).member("b", 2*time.Second).member("c", 9*time.Second).settled(ids...)
	assign := Assign(64, ids)
	p := w.decide("a", ownOf(assign, "a"))
	if len(p.give)+len(p.take)+len(p.stray)+len(p.handed) != 0 {
		t.Fatalf("settled: give %v take %v stray %v handed %v", p.give, p.take, p.stray, p.handed)
	}
	for _, to := range p.takeovers {
		if to.holder != "b#1" && to.holder != "c#1" {
			t.Errorf("a takeover of %s's shards %v", to.holder, to.shards)
		}
	}
	if !slices.Equal(p.assign, assign) {
		t.Fatal("settled: the assignment moved")
	}
	want := RunnersUp(64, ids, assign, "a")
	if len(want) == 0 {
		t.Fatal("a is the runner-up of no shard")
	}
	for s, prio := range p.cands {
		if prio != priorityRunnerUp || !want[s] {
			t.Errorf("shard %d: candidacy %d, runner-up %v", s, prio, want[s])
		}
	}
	if len(p.cands) != len(want) {
		t.Errorf("%d candidacies, %d runner-up shards", len(p.cands), len(want))
	}
	if p.next != 2*time.Second {
		t.Errorf("next %v, want b's expiry in 2s", p.next)
	}
}

// TestPlanJoin: a joiner registers, before it is a member, for exactly the
// shards it will win; each owner then gives up exactly those, and the
// joiner, once a member, waits for them (polls) with an assigned candidacy
// rather than acquiring a held key.
func TestPlanJoin(t *testing.T) {
	ids := []string{"a", "b", "c"}
	w := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second).member("c", 9*time.Second).settled(ids...)
	before := Assign(64, ids)
	after := Balance(64, []string{"a", "b", "c", "d"}, before)
	wins := shardsOf(after, "d")
	cands := joinCandidacies(64, w.snap("d"), "d", "d#1")
	if got := slices.Sorted(maps.Keys(cands)); !slices.Equal(got, wins) {
		t.Fatalf("joiner registers for %v, wins %v", got, wins)
	}
	w.member("d", 9*time.Second)
	var given []int
	for _, id := range ids {
		p := w.decide(id, ownOf(before, id))
		given = append(given, p.give...)
		if len(p.take) != 0 {
			t.Errorf("%s takes %v on a join", id, p.take)
		}
	}
	if slices.Sort(given); !slices.Equal(given, wins) {
		t.Errorf("the owners give up %v, the joiner wins %v", given, wins)
	}
	p := w.decide("d", nil)
	if len(p.take) != 0 || p.next != 50*time.Millisecond {
		t.Errorf("joiner: take %v next %v; want nothing taken, a poll", p.take, p.next)
	}
	for _, s := range wins {
		if p.cands[s] != priorityAssigned {
			t.Errorf("joiner: shard %d candidacy %d", s, p.cands[s])
		}
	}
}

// TestPlanRunnerUpsDuringAJoin: while a joiner's shards still move (it is
// a member and holds none), each member registers as runner-up for exactly
// the shards it registers for once the join settled: its candidacies change
// once per join, and a leave during the moves finds them in place.
func TestPlanRunnerUpsDuringAJoin(t *testing.T) {
	ids := []string{"a", "b", "c"}
	all := []string{"a", "b", "c", "d"}
	before := Assign(64, ids)
	after := Balance(64, all, before)
	moving := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second).member("c", 9*time.Second).
		settled(ids...).member("d", 9*time.Second)
	done := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second).member("c", 9*time.Second).
		member("d", 9*time.Second)
	for s, id := range after {
		done.shard(s, id+"#1", 9*time.Second)
	}
	for _, id := range ids {
		mid := moving.decide(id, ownOf(before, id)).cands
		end := done.decide(id, ownOf(after, id)).cands
		if len(end) == 0 {
			t.Fatalf("%s is the runner-up of no shard after the join", id)
		}
		if !maps.Equal(mid, end) {
			t.Errorf("%s: candidacies while the shards move %v, after %v", id, mid, end)
		}
	}
}

// TestPlanCrash: a crashed member's lapsed shards are taken at once, each
// by the replica Balance names, all of them in one round; a grant still
// running is taken over at its lapse (at its local expiry).
func TestPlanCrash(t *testing.T) {
	ids := []string{"a", "b", "c"}
	before := Assign(64, ids)
	w := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second) // c's member key lapsed
	later := -1
	for s, id := range before {
		switch {
		case id != "c":
			w.shard(s, id+"#1", 9*time.Second)
		case later < 0:
			later = s
			w.shard(s, "c#1", 30*time.Millisecond) // renewed after the others
		default:
			w.shard(s, "", 0) // lapsed: list shows it not held
		}
	}
	after := Balance(64, []string{"a", "b"}, before)
	var took []int
	for _, id := range []string{"a", "b"} {
		p := w.decide(id, ownOf(before, id))
		if len(p.give) != 0 {
			t.Errorf("%s gives up %v", id, p.give)
		}
		for _, s := range p.take {
			if after[s] != id {
				t.Errorf("%s takes shard %d of %s", id, s, after[s])
			}
		}
		took = append(took, p.take...)
		want := []takeover{}
		if after[later] == id {
			// Sent a Poll before the lapse, asked at it.
			want = append(want, takeover{holder: "c#1", at: w.now.Add(30*time.Millisecond - 50*time.Millisecond),
				expires: w.now.Add(30 * time.Millisecond), shards: []int{later}})
		}
		// a and b are members: each plans the takeover of the other's shards.
		var got []takeover
		for _, to := range p.takeovers {
			if to.holder == "c#1" {
				got = append(got, to)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: takeovers of c %v, want %v", id, got, want)
		}
	}
	if slices.Sort(took); len(took) != len(shardsOf(before, "c"))-1 {
		t.Errorf("took %v of c's %d shards (one still running)", took, len(shardsOf(before, "c")))
	}
}

// TestPlanCrashKeysLapsingApart: c crashed between a take and the renewal
// of all its keys: its member key and some shards lapsed, the rest lapse
// in 80 ms. Each survivor takes c's shards that come to it in one
// statement at that last lapse, those already lapsed with them: none now
// in a statement of their own.
func TestPlanCrashKeysLapsingApart(t *testing.T) {
	ids := []string{"a", "b", "c"}
	before := Assign(64, ids)
	w := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second)
	for i, s := range shardsOf(before, "c") {
		if i%2 == 0 {
			w.lapsed(s, "c#1")
		} else {
			w.shard(s, "c#1", 80*time.Millisecond)
		}
	}
	for s, id := range before {
		if id != "c" {
			w.shard(s, id+"#1", 9*time.Second)
		}
	}
	after := Balance(64, []string{"a", "b"}, before)
	for _, id := range []string{"a", "b"} {
		p := w.decide(id, ownOf(before, id))
		if len(p.take) != 0 {
			t.Errorf("%s takes %v now, apart from its takeover", id, p.take)
		}
		var of []takeover
		for _, to := range p.takeovers {
			if to.holder == "c#1" {
				of = append(of, to)
			}
		}
		var want []int
		for _, s := range shardsOf(before, "c") {
			if after[s] == id {
				want = append(want, s)
			}
		}
		if len(of) != 1 || !slices.Equal(of[0].shards, want) {
			t.Errorf("%s: takeovers of c %v, want one of %v", id, of, want)
			continue
		}
		if e := w.now.Add(80 * time.Millisecond); !of[0].expires.Equal(e) || !of[0].at.Equal(e.Add(-50*time.Millisecond)) {
			t.Errorf("%s takes over c's shards asked at %v, sent at %v, want +80ms and a Poll before",
				id, of[0].expires.Sub(w.now), of[0].at.Sub(w.now))
		}
	}
}

// TestPlanCrashTakeoverOfAFreeShard: a grant handed to c lapsed before
// c's member key (c renewed its keys before it took that grant): the shard
// is free and Balance gives it to c, live. Were c's keys to lapse, the
// replica Balance without c gives it to takes it with c's other shards, in
// the one statement asked at c's member key's expiry.
func TestPlanCrashTakeoverOfAFreeShard(t *testing.T) {
	ids := []string{"a", "b", "c"}
	before := Assign(64, ids)
	w := newWorld(64).member("a", 9*time.Second).member("b", 9*time.Second).member("c", 2*time.Second)
	cs := shardsOf(before, "c")
	free := cs[0]
	for s, id := range before {
		if s == free {
			w.lapsed(s, "c#1")
			continue
		}
		w.shard(s, id+"#1", map[string]time.Duration{"a": 9 * time.Second, "b": 9 * time.Second, "c": 2 * time.Second}[id])
	}
	without := Balance(64, []string{"a", "b"}, before)
	for _, id := range []string{"a", "b"} {
		p := w.decide(id, ownOf(before, id))
		if slices.Contains(p.take, free) {
			t.Errorf("%s takes shard %d, Balance gives it to c", id, free)
		}
		var want []int
		for _, s := range cs {
			if without[s] == id {
				want = append(want, s)
			}
		}
		var of []takeover
		for _, to := range p.takeovers {
			if to.holder == "c#1" {
				of = append(of, to)
			}
		}
		if len(of) != 1 || !slices.Equal(of[0].shards, want) {
			t.Errorf("%s: takeovers of c %v, want one of %v", id, of, want)
			continue
		}
		if e := w.now.Add(2 * time.Second); !of[0].expires.Equal(e) {
			t.Errorf("%s takes over c's shards asked at %v, want +2s", id, of[0].expires.Sub(w.now))
		}
	}
}

// TestPlanCrashTakeover: while every member is live, each replica plans,
// for each other member, one takeover of the shards Balance without that
// member gives it, asked at the last expiry of that member's keys (its
// member key's, or a shard's taken since its last renewal) and sent a Poll
// before it: were it to crash, its shards are taken at that instant, all of them, one statement
// per surviving replica, each shard by one replica.
func TestPlanCrashTakeover(t *testing.T) {
	ids := []string{"a", "b", "c"}
	before := Assign(64, ids)
	w := newWorld(64).member("a", 9*time.Second).member("b", 5*time.Second).member("c", 2*time.Second)
	cs := shardsOf(before, "c")
	for s, id := range before {
		d := map[string]time.Duration{"a": 9 * time.Second, "b": 5 * time.Second, "c": 2 * time.Second}[id]
		if s == cs[len(cs)-1] {
			d = 2*time.Second + 300*time.Millisecond // taken after c's last renewal
		}
		w.shard(s, id+"#1", d)
	}
	without := Balance(64, []string{"a", "b"}, before)
	var taken []int
	for _, id := range []string{"a", "b"} {
		p := w.decide(id, ownOf(before, id))
		var of []takeover
		for _, to := range p.takeovers {
			if to.holder == "c#1" {
				of = append(of, to)
			}
		}
		if len(of) != 1 {
			t.Fatalf("%s: %d takeovers of c's shards, want 1: %v", id, len(of), p.takeovers)
		}
		to := of[0]
		var want []int
		for _, s := range cs {
			if without[s] == id {
				want = append(want, s)
			}
		}
		if !slices.Equal(to.shards, want) {
			t.Errorf("%s takes over %v of c's, want %v", id, to.shards, want)
		}
		wantAt := w.now.Add(2 * time.Second)
		if slices.Contains(want, cs[len(cs)-1]) {
			wantAt = w.now.Add(2*time.Second + 300*time.Millisecond)
		}
		// Asked at the lapse, sent a Poll before it.
		if !to.expires.Equal(wantAt) || !to.at.Equal(wantAt.Add(-50*time.Millisecond)) {
			t.Errorf("%s takes over c's shards asked at %v, sent at %v, want %v and a Poll before",
				id, to.expires.Sub(w.now), to.at.Sub(w.now), wantAt.Sub(w.now))
		}
		if !p.takeovers[0].at.Equal(to.at) {
			t.Errorf("%s: the first takeover is at %v, not c's", id, p.takeovers[0].at.Sub(w.now))
		}
		taken = append(taken, to.shards...)
	}
	slices.Sort(taken)
	if !slices.Equal(taken, cs) {
		t.Errorf("a and b take over %v, c holds %v", taken, cs)
	}
}

// TestPlanWake: the next round is at the earliest of the plan's instants,
// counted from the list: a member's expiry in 2 s wakes the replica 2 s
// after the list, however long the round's statements take after it.
func TestPlanWake(t *testing.T) {
	ids := []string{"a", "b", "c"}
	w := newWorld(64).member("a", 9*time.Second).member("b", 2*time.Second).member("c", 9*time.Second).settled(ids...)
	p := w.decide("a", ownOf(Assign(64, ids), "a"))
	if got := p.wake(w.now); !got.Equal(w.now.Add(2 * time.Second)) {
		t.Errorf("wake %v after the list, want 2s (b's expiry)", got.Sub(w.now))
	}
	p.next, p.takeovers = 3*time.Second, []takeover{{holder: "x#1", at: w.now.Add(time.Second), shards: []int{1}}}
	if got := p.wake(w.now); !got.Equal(w.now.Add(time.Second)) {
		t.Errorf("wake %v after the list, want 1s (the takeover)", got.Sub(w.now))
	}
}

// TestPlanStrayAndHanded: a grant handed to this process for a shard
// assigned here is taken (an acquire answers it) and noted as handed; one
// for a shard assigned elsewhere is released again; an owned shard that
// is no longer this replica's is given up, one being given up is left.
func TestPlanStrayAndHanded(t *testing.T) {
	ids := []string{"a", "b"}
	assign := Assign(8, ids)
	mine, theirs := shardsOf(assign, "a"), shardsOf(assign, "b")
	w := newWorld(8).member("a", 9*time.Second).member("b", 9*time.Second)
	for s := range 8 {
		w.shard(s, "a#1", 9*time.Second) // every shard handed to a
	}
	own := map[int]bool{theirs[0]: true, theirs[1]: false}
	p := w.decide("a", own)
	if !slices.Equal(p.take, mine) {
		t.Errorf("take %v, want %v", p.take, mine)
	}
	for _, s := range mine {
		if p.handed[s].Epoch != int64(s+1) {
			t.Errorf("shard %d handed %v", s, p.handed[s])
		}
	}
	if !slices.Equal(p.give, theirs[:1]) {
		t.Errorf("give %v, want %v", p.give, theirs[:1])
	}
	var stray []int
	for _, tk := range p.stray {
		s, _ := parseShard("ctl", tk.Key, 8)
		stray = append(stray, s)
	}
	if !slices.Equal(stray, theirs[2:]) {
		t.Errorf("stray %v, want %v", stray, theirs[2:])
	}
}

// TestPlanAnotherProcessOfThisIdentity: a member key of this identity held
// by another process is not this replica: it joins as itself.
func TestPlanAnotherProcessOfThisIdentity(t *testing.T) {
	w := newWorld(4)
	w.states = append(w.states, lease.State{Key: MemberKey("ctl", "a"), Exists: true, Held: true, Owner: "a#old"})
	w.exp = append(w.exp, at(w.now.Add(time.Second)))
	sn := w.snap("a")
	if len(sn.members) != 0 || sn.memberLapse != 0 {
		t.Errorf("members %v lapse %v", sn.members, sn.memberLapse)
	}
}

// TestDue: the shards of the takeovers whose instant passed come out in
// order, once each, the rest stay.
func TestDue(t *testing.T) {
	now := time.Unix(0, 0)
	tos := []takeover{
		{holder: "x", at: now, expires: now.Add(40 * time.Millisecond), shards: []int{3, 1}},
		{holder: "y", at: now.Add(-time.Second), expires: now.Add(-950 * time.Millisecond), shards: []int{4, 1}},
		{holder: "z", at: now.Add(time.Second), expires: now.Add(2 * time.Second), shards: []int{2}},
		{holder: "w", at: now.Add(2 * time.Second), shards: []int{5}},
	}
	got, first, expires, left := due(tos, now)
	if fmt.Sprint(got) != "[1 3 4]" || !first.Equal(now.Add(-time.Second)) || !expires.Equal(now.Add(40*time.Millisecond)) ||
		len(left) != 2 || left[0].holder != "z" || left[1].holder != "w" {
		t.Errorf("due %v first %v expires %v left %v", got, first, expires, left)
	}
}

// TestHandedTo: of a wake's events, the handovers of this controller's
// shards to this process, in order, once each with the latest epoch
// notified, but for shards it acts under already, grants it is giving up
// (the epoch it tracks) and epochs below 1; releases, grants, other owners, other controllers' keys
// and shards out of range are not.
func TestHandedTo(t *testing.T) {
	ev := func(typ listen.EventType, key, owner string) listen.Event {
		return listen.Event{Type: typ, Key: key, Owner: owner, Epoch: 7}
	}
	tracked := map[int]int64{2: math.MaxInt64, 4: 6, 8: 7} // 2: acting; 4, 8: being given up
	events := []listen.Event{
		ev(listen.EventHandover, Key("ctl", 9), "a#1"),
		ev(listen.EventHandover, Key("ctl", 1), "a#1"),
		ev(listen.EventHandover, Key("ctl", 9), "a#1"),
		ev(listen.EventHandover, Key("ctl", 2), "a#1"),   // acts under it
		ev(listen.EventHandover, Key("ctl", 4), "a#1"),   // giving it up: a new grant
		ev(listen.EventHandover, Key("ctl", 8), "a#1"),   // giving up that grant: forged
		ev(listen.EventHandover, Key("ctl", 3), "b#1"),   // another owner
		ev(listen.EventHandover, Key("other", 5), "a#1"), // another controller
		ev(listen.EventHandover, Key("ctl", 64), "a#1"),  // no such shard
		ev(listen.EventReleased, Key("ctl", 6), "a#1"),
		ev(listen.EventAcquired, Key("ctl", 7), "a#1"),
		ev(listen.EventHandover, "ctl/changed", "a#1"),
	}
	events = append(events, listen.Event{Type: listen.EventHandover, Key: Key("ctl", 1), Owner: "a#1", Epoch: 9},
		listen.Event{Type: listen.EventHandover, Key: Key("ctl", 5), Owner: "a#1", Epoch: 0}) // no grant: forged
	got, tokens := handedTo("ctl", 64, "a#1", events, tracked)
	if want := []int{1, 4, 9}; !slices.Equal(got, want) {
		t.Errorf("handedTo: %v, want %v", got, want)
	}
	want := []lease.Token{{Key: Key("ctl", 1), Owner: "a#1", Epoch: 9}, {Key: Key("ctl", 4), Owner: "a#1", Epoch: 7},
		{Key: Key("ctl", 9), Owner: "a#1", Epoch: 7}}
	if !slices.Equal(tokens, want) {
		t.Errorf("handedTo: tokens %v, want %v (the latest grant of each)", tokens, want)
	}
}

// TestPlanLiveMemberNotAskedBeforeItsNextRound: a member that renews on
// time (every RenewEvery, a third of the TTL) is never sent a takeover of
// its shards: the next round lists again, sees the renewal and plans anew,
// before the takeover is due. Sent earlier, the takeover waits on the
// server until the expiry it saw, holding a connection and the replica's
// moves (its rounds and handovers wait) for nothing: the server refuses it.
// Here b renewed 0.9 s ago (TTL 3 s, RenewEvery 1 s, a Poll of 1.5 s): its
// keys lapse in 2.1 s unless renewed, and it renews in 0.1 s.
func TestPlanLiveMemberNotAskedBeforeItsNextRound(t *testing.T) {
	const ttl, renewEvery, poll = 3 * time.Second, time.Second, 1500 * time.Millisecond
	ids := []string{"a", "b"}
	assign := Assign(16, ids)
	w := newWorld(16).member("a", ttl).member("b", 2100*time.Millisecond)
	for s, id := range assign {
		w.shard(s, id+"#1", map[string]time.Duration{"a": ttl, "b": 2100 * time.Millisecond}[id])
	}
	p := decide(planInput{n: w.n, identity: "a", owner: "a#1", snap: w.snap("a").withSelf("a", "a#1"),
		own: ownOf(assign, "a"), listed: w.now, next: renewEvery, poll: poll, ttl: ttl, waiter: true})
	for _, to := range p.takeovers {
		if to.holder == "b#1" && to.at.Before(w.now.Add(renewEvery)) {
			t.Errorf("b's shards %v are asked for at +%v, before the next round at +%v, though b renews at +100ms",
				to.shards, to.at.Sub(w.now), renewEvery)
		}
	}
	if wake := p.wake(w.now); wake.Before(w.now.Add(renewEvery)) {
		t.Errorf("the next round is at +%v, want +%v: nothing is due before it", wake.Sub(w.now), renewEvery)
	}
}

package shard

import (
	"slices"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// snapshot is one lease.list of a controller's keys, as one replica reads
// it: a pure function of the listed states.
type snapshot struct {
	// members are the live members, sorted: those whose member key is
	// held, but for a member key of this identity held by another process.
	members []string
	// memberOwners maps the holder of each live member key to its member.
	memberOwners map[string]string
	// shards holds each shard's state (Exists false: never leased).
	shards []lease.State
	// expires is, per shard, its holder's expiry (zero when not held).
	expires []expiry
	// holders names, per shard, the live member holding it ("": nobody).
	holders []string
	// memberLapse is the earliest local bound of another member's expiry
	// after listed (0: none): a crashed member's keys lapse then.
	memberLapse time.Duration
	// memberExpires is each other live member's expiry.
	memberExpires map[string]expiry
}

// expiry is a grant's expiry on the server's clock, and the local instants
// between which the server's clock shows it.
type expiry struct {
	server, early, late time.Time
}

// readSnapshot builds the snapshot of states, listed at local time listed,
// for the replica identity whose process holds its keys as owner.
func readSnapshot(controller string, n int, identity, owner string, states []lease.State, listed time.Time) snapshot {
	exp := make([]expiry, len(states))
	for i, st := range states {
		if st.Held {
			exp[i] = expiry{server: st.ExpiresAt, early: st.ExpiresEarliest(), late: st.ExpiresLocal()}
		}
	}
	return buildSnapshot(controller, n, identity, owner, states, exp, listed)
}

// buildSnapshot is readSnapshot with each state's expiry given (exp[i] for
// states[i]).
func buildSnapshot(controller string, n int, identity, owner string, states []lease.State, exp []expiry, listed time.Time) snapshot {
	sn := snapshot{memberOwners: map[string]string{}, shards: make([]lease.State, n),
		expires: make([]expiry, n), holders: make([]string, n), memberExpires: map[string]expiry{}}
	for s := range n {
		sn.shards[s] = lease.State{Key: Key(controller, s)}
	}
	for i, st := range states {
		if mem, ok := memberOf(controller, st.Key); ok && st.Held {
			if mem == identity && st.Owner != owner {
				continue // another process of this identity: ensureMember decides
			}
			sn.members = append(sn.members, mem)
			sn.memberOwners[st.Owner] = mem
			if mem != identity {
				sn.memberExpires[mem] = exp[i]
			}
			if d := exp[i].late.Sub(listed); mem != identity && d > 0 && (sn.memberLapse == 0 || d < sn.memberLapse) {
				sn.memberLapse = d
			}
			continue
		}
		if s, ok := parseShard(controller, st.Key, n); ok {
			sn.shards[s], sn.expires[s] = st, exp[i]
		}
	}
	slices.Sort(sn.members)
	sn.members = slices.Compact(sn.members)
	sn.setHolders()
	return sn
}

func (sn *snapshot) setHolders() {
	for s, st := range sn.shards {
		sn.holders[s] = ""
		if st.Held {
			sn.holders[s] = sn.memberOwners[st.Owner]
		}
	}
}

// withSelf is sn with this replica among the members (it is joining: its
// member key is not held yet, or not seen).
func (sn snapshot) withSelf(identity, owner string) snapshot {
	out := sn
	out.memberOwners = make(map[string]string, len(sn.memberOwners)+1)
	for o, m := range sn.memberOwners {
		out.memberOwners[o] = m
	}
	out.memberOwners[owner] = identity
	if !slices.Contains(sn.members, identity) {
		out.members = slices.Sorted(slices.Values(append(slices.Clone(sn.members), identity)))
	}
	out.holders = make([]string, len(sn.shards))
	out.setHolders()
	return out
}

// joinCandidacies returns the shards a joining replica registers for before
// the others see it: those Balance gives it that another process holds.
// Their owners' releases then hand them to it.
func joinCandidacies(n int, sn snapshot, identity, owner string) map[int]int32 {
	with := sn.withSelf(identity, owner)
	cands := map[int]int32{}
	for s, o := range Balance(n, with.members, with.holders) {
		if st := with.shards[s]; o == identity && st.Held && st.Owner != owner {
			cands[s] = priorityAssigned
		}
	}
	return cands
}

// planInput is what a round decides from: the snapshot (with this replica
// among its members), the shards this replica tracks, and its settings.
type planInput struct {
	n               int
	identity, owner string
	snap            snapshot
	// own has an entry per shard this replica tracks: true while it acts
	// under it, false while it is giving it up.
	own    map[int]bool
	listed time.Time
	next   time.Duration // the longest wait before the next round
	poll   time.Duration
	ttl    time.Duration // the member and shard keys' TTL
	waiter bool          // a Waiter wakes the replica at releases
}

// lead is how long before the earliest local bound of a lapse its
// takeover is sent: a Poll, but at most half the time that a member
// renewing every next for ttl leaves between the next round and that
// bound, so that the next round lists the renewal of a live member before
// its takeover is due (a takeover sent waits on the server until the
// lapse, holding a connection and the moves, only to be refused).
func (in planInput) lead() time.Duration {
	return max(0, min(in.poll, (in.ttl-2*in.next)/2))
}

// plan is a round's decision.
type plan struct {
	assign []string
	// give are the shards this replica acts under and must give up.
	give []int
	// take are the shards to acquire now (in shard order).
	take []int
	// handed are the shards of take already granted to this process (a
	// handover): taken by an acquire that answers the caller's own grant.
	handed map[int]lease.Token
	// stray are grants handed to this process for shards not assigned to
	// it: to release again (the release hands them on).
	stray []lease.Token
	// takeovers are the shards to take when their holder's keys lapse, one
	// statement per holder: those assigned here whose holder is no live
	// member (it left or crashed), with those of its grants that lapsed
	// already, and those of each other live member that come here were it
	// to stop renewing (it crashed).
	takeovers []takeover
	// cands are the handover candidacies to hold: priorityAssigned for
	// shards assigned here and held by another, priorityRunnerUp for shards
	// that come here if the member they are assigned to leaves.
	cands map[int]int32
	// next is when to run the next round.
	next time.Duration
}

// decide computes the round's plan: a pure function of in.
func decide(in planInput) plan {
	sn := in.snap
	p := plan{assign: Balance(in.n, sn.members, sn.holders), handed: map[int]lease.Token{},
		cands: map[int]int32{}, next: in.next}
	if sn.memberLapse > 0 {
		p.next = min(p.next, sn.memberLapse)
	}
	// Runner-ups of the assignment, not of the holders: while shards move
	// (a join), the candidacies are already those of the state the moves
	// lead to, so they change once, and a leave meanwhile finds them.
	runnerUp := runnersUp(in.n, sn.members, p.assign, in.identity)
	lapsing := map[string]*takeover{} // by holder
	lapsed := map[string][]int{}      // free shards to take, by the owner whose grant lapsed
	lead := in.lead()
	for s := range in.n {
		st := sn.shards[s]
		active, tracked := in.own[s]
		mine := p.assign != nil && p.assign[s] == in.identity
		switch {
		case !mine:
			if tracked && active {
				p.give = append(p.give, s)
			}
			if !tracked && st.Held && st.Owner == in.owner {
				p.stray = append(p.stray, lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch})
			}
			if runnerUp[s] {
				p.cands[s] = priorityRunnerUp
			}
		case tracked:
		case st.Held && st.Owner != in.owner:
			p.cands[s] = priorityAssigned
			if p.waitFor(st, sn.expires[s].late, sn, in) {
				to := lapsing[st.Owner]
				if to == nil {
					to = &takeover{holder: st.Owner}
					lapsing[st.Owner] = to
				}
				to.add(s, sn.expires[s], lead)
			}
		default:
			if st.Held {
				p.handed[s] = lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch}
			} else if st.Lapsed && st.LastOwner != "" {
				lapsed[st.LastOwner] = append(lapsed[st.LastOwner], s)
			}
			p.take = append(p.take, s)
		}
	}
	// A holder whose keys lapse at several instants (it crashed between a
	// take and the renewal of all its keys): the shards of its grants that
	// lapsed already go with those still held, in its takeover at their
	// last lapse, one statement for all.
	folded := map[int]bool{}
	for h, to := range lapsing {
		for _, s := range lapsed[h] {
			folded[s] = true
			to.shards = append(to.shards, s)
		}
		slices.Sort(to.shards)
		p.takeovers = append(p.takeovers, *to)
	}
	p.take = slices.DeleteFunc(p.take, func(s int) bool { return folded[s] })
	p.takeovers = append(p.takeovers, crashTakeovers(in, p.assign)...)
	slices.SortFunc(p.takeovers, func(a, b takeover) int { return a.at.Compare(b.at) })
	return p
}

// wake is when to run the next round: the plan's instants are counted from
// the list the plan was decided from (listed), not from the end of the
// round's statements, so a slow round does not delay a takeover.
func (p plan) wake(listed time.Time) time.Time {
	at := listed.Add(p.next)
	for _, to := range p.takeovers {
		if to.at.Before(at) {
			at = to.at
		}
	}
	return at
}

// takeover is the shards one holder's keys keep from this replica: taken
// in one statement asked at expires, the last server expiry of those keys
// (and of the holder's member key), and sent at at, a lead before the
// earliest local instant of that expiry (planInput.lead): the statement waits on the server
// (lease.Client.AcquireManyAt) and finds the keys lapsed unless renewed,
// with no round trip after they lapse.
type takeover struct {
	holder  string // the owner holding the keys
	at      time.Time
	expires time.Time // on the server's clock
	shards  []int
}

// add adds shard s, whose grant expires at e, to be sent lead before it.
func (to *takeover) add(s int, e expiry, lead time.Duration) {
	to.shards = append(to.shards, s)
	to.after(e, lead)
}

// after moves the takeover after e, to be sent lead before it.
func (to *takeover) after(e expiry, lead time.Duration) {
	if at := e.early.Add(-lead); at.After(to.at) {
		to.at = at
	}
	if e.server.After(to.expires) {
		to.expires = e.server
	}
}

// crashTakeovers returns, for each other live member, the shards it holds
// and the free shards assign gives it (it has not taken them yet) that
// Balance without it gives this replica: what this replica takes, all in
// one statement, when that member's keys lapse (it renews its member key
// and shard keys in one statement, so they lapse at one instant), with no
// read before.
func crashTakeovers(in planInput, assign []string) []takeover {
	sn := in.snap
	var out []takeover
	lead := in.lead()
	owners := map[string]string{} // member -> owner
	for o, m := range sn.memberOwners {
		owners[m] = o
	}
	for _, y := range sn.members {
		if y == in.identity {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(sn.members), func(m string) bool { return m == y })
		hs := slices.Clone(sn.holders)
		var held []int
		for s, h := range hs {
			if h == y {
				hs[s] = ""
				held = append(held, s)
			} else if !sn.shards[s].Held && assign != nil && assign[s] == y {
				held = append(held, s)
			}
		}
		if len(held) == 0 {
			continue
		}
		after := Balance(in.n, rest, hs)
		to := takeover{holder: owners[y]}
		to.after(sn.memberExpires[y], lead)
		for _, s := range held {
			if after[s] == in.identity {
				to.add(s, sn.expires[s], lead)
			}
		}
		if len(to.shards) > 0 {
			out = append(out, to)
		}
	}
	return out
}

// waitFor notes when to try shard s again, held by another, and reports
// whether to take it when its grant lapses: a live member is releasing it,
// and a release notifies (with a Waiter), so poll as well; a holder that
// is no member left or crashed, and its grant lapses at its expiry (the
// latest bound on the local clock).
func (p *plan) waitFor(st lease.State, exp time.Time, sn snapshot, in planInput) (lapsing bool) {
	d := exp.Sub(in.listed)
	_, member := sn.memberOwners[st.Owner]
	switch {
	case member || d <= 0:
		p.next = min(p.next, in.poll)
		return false
	case !in.waiter:
		p.next = min(p.next, in.poll, d)
	}
	return true
}

// due returns the shards of the takeovers whose instant is not after now,
// in order, and the takeovers left; first is the earliest instant of those
// taken (zero: none), expires the last server expiry they wait for.
func due(takeovers []takeover, now time.Time) (shards []int, first, expires time.Time, left []takeover) {
	for _, to := range takeovers {
		if to.at.After(now) {
			left = append(left, to)
			continue
		}
		shards = append(shards, to.shards...)
		if first.IsZero() || to.at.Before(first) {
			first = to.at
		}
		if to.expires.After(expires) {
			expires = to.expires
		}
	}
	slices.Sort(shards)
	return slices.Compact(shards), first, expires, left
}

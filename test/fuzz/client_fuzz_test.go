package fuzz

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Operations of FuzzClient (op % numOps).
const (
	opAcquire = iota
	opAcquireWait
	opRenew
	opRelease
	opInspect
	opList
	opFence
	opForceRelease
	numOps
)

var opNames = [numOps]string{"Acquire", "AcquireWait", "Renew", "Release", "Inspect", "List", "Fence", "ForceRelease"}

// Starting states of the key (pre % numPre).
const (
	preNone   = iota // never leased
	preHeld          // held by the caller's owner (epoch cur)
	preOther         // held by another owner
	preFree          // granted to the caller, released (counter cur)
	preLapsed        // granted to the caller, expired
	numPre
)

var preNames = [numPre]string{"never leased", "held by owner", "held by another", "free", "lapsed"}

// FuzzClient calls pkg/lease with fuzzed arguments from a fuzzed starting
// state. Arguments: op, pre (starting state), key, owner, epochDelta (the
// epoch presented is the key's current epoch + epochDelta), ttl and wait
// (time.Duration, nanoseconds: negative, zero, sub-microsecond, up to 292
// years).
func FuzzClient(f *testing.F) {
	for _, s := range []struct {
		op, pre              uint8
		key, owner           string
		epochDelta, ttl, wai int64
	}{
		{opAcquire, preNone, "k", "o", 0, int64(time.Second), 0},
		{opAcquire, preOther, "k", "o", 0, int64(time.Second), 0},
		{opAcquire, preHeld, "k", "o", 0, int64(time.Minute), 0},
		{opAcquire, preLapsed, "k", "o", 0, int64(time.Second), 0},
		{opAcquire, preFree, "k", "o", 0, int64(time.Second), 0},
		{opAcquire, preNone, "", "o", 0, int64(time.Second), 0},
		{opAcquire, preNone, "k", "", 0, int64(time.Second), 0},
		{opAcquire, preNone, "k", "o", 0, 0, 0},
		{opAcquire, preNone, "k", "o", 0, -1, 0},
		{opAcquire, preNone, "k", "o", 0, 999, 0},
		{opAcquire, preNone, "k", "o", 0, 1000, 0},
		{opAcquire, preNone, "k", "o", 0, 1<<63 - 1, 0},
		{opAcquire, preNone, "k", "o", 0, -1 << 63, 0},
		{opAcquire, preNone, strings.Repeat("k", 1024), strings.Repeat("o", 1024), 0, int64(time.Second), 0},
		{opAcquire, preNone, strings.Repeat("k", 1025), "o", 0, int64(time.Second), 0},
		{opAcquire, preNone, strings.Repeat("é", 512), strings.Repeat("é", 513), 0, int64(time.Second), 0},
		{opAcquire, preNone, strings.Repeat("\x01", 1024), strings.Repeat("\x01", 400), 0, int64(time.Second), 0},
		{opAcquire, preNone, "k\x00", "o", 0, int64(time.Second), 0},
		{opAcquire, preNone, "k\xff", "o", 0, int64(time.Second), 0},
		{opAcquire, preNone, "k\n\"\\'", "o;DROP TABLE lease.leases", 0, int64(time.Second), 0},
		{opAcquireWait, preNone, "k", "o", 0, int64(time.Second), int64(time.Second)},
		{opAcquireWait, preOther, "k", "o", 0, int64(time.Second), int64(10 * time.Millisecond)},
		{opAcquireWait, preOther, "k", "o", 0, int64(time.Second), 0},
		{opAcquireWait, preNone, "k", "o", 0, int64(time.Second), -1},
		{opAcquireWait, preNone, "k", "o", 0, int64(time.Second), 1},
		{opRenew, preHeld, "k", "o", 0, int64(time.Second), 0},
		{opRenew, preHeld, "k", "o", 1, int64(time.Second), 0},
		{opRenew, preHeld, "k", "o", -1, int64(time.Second), 0},
		{opRenew, preHeld, "k", "o", -1 << 63, int64(time.Second), 0},
		{opRenew, preLapsed, "k", "o", 0, int64(time.Second), 0},
		{opRenew, preOther, "k", "o", 0, int64(time.Second), 0},
		{opRenew, preFree, "k", "o", -1, int64(time.Second), 0},
		{opRenew, preNone, "k", "o", 1, int64(time.Second), 0},
		{opRenew, preHeld, "k", "o", 0, 0, 0},
		{opRelease, preHeld, "k", "o", 0, 0, 0},
		{opRelease, preHeld, "k", "o", 1, 0, 0},
		{opRelease, preLapsed, "k", "o", 0, 0, 0},
		{opRelease, preOther, "k", "o", 0, 0, 0},
		{opRelease, preNone, "k", "o", 0, 0, 0},
		{opRelease, preHeld, strings.Repeat("\x01", 1024), strings.Repeat("\x01", 400), 0, 0, 0},
		{opInspect, preNone, "k", "", 0, 0, 0},
		{opInspect, preLapsed, "k", "", 0, 0, 0},
		{opInspect, preNone, "", "", 0, 0, 0},
		{opList, preHeld, "k", "o", 0, 0, 0},
		{opFence, preHeld, "k", "o", 0, 0, 0},
		{opFence, preHeld, "k", "o", 1, 0, 0},
		{opFence, preLapsed, "k", "o", 0, 0, 0},
		{opFence, preOther, "k", "o", 0, 0, 0},
		{opFence, preHeld, "k", "o", -1 << 63, 0, 0},
		{opForceRelease, preHeld, "k", "", 0, 0, 0},
		{opForceRelease, preFree, "k", "", 0, 0, 0},
		{opForceRelease, preNone, "k", "", 0, 0, 0},
		{opForceRelease, preLapsed, "k", "", 0, 0, 0},
	} {
		f.Add(s.op, s.pre, s.key, s.owner, s.epochDelta, s.ttl, s.wai)
	}
	h := newHarness(f)
	f.Fuzz(func(t *testing.T, op, pre uint8, key, owner string, epochDelta, ttl, wait int64) {
		h.fuzzClient(t, op%numOps, pre%numPre, key, owner, epochDelta, time.Duration(ttl), time.Duration(wait))
	})
}

func (h *harness) fuzzClient(t *testing.T, op, pre uint8, key, owner string, epochDelta int64, ttl, wait time.Duration) {
	ctx := ctxFor(t)
	r := h.rules
	c := h.client
	takesOwner := op == opAcquire || op == opAcquireWait || op == opRenew || op == opRelease || op == opFence
	takesEpoch := op == opRenew || op == opRelease || op == opFence
	takesTTL := op == opAcquire || op == opAcquireWait || op == opRenew
	if op == opList {
		key = "k" // List takes no argument; its key is the one looked for
	}
	if !takesOwner && (!representable(owner) || r.textViolation("owner", &owner) != "") {
		owner = "fuzz-owner" // not an argument: only the holder of the starting state
	}

	// The expectation.
	var vs violations
	unrep := !representable(key) || (takesOwner && !representable(owner))
	vs.text(r, "key", &key)
	if takesOwner {
		vs.text(r, "owner", &owner)
	}
	// pkg/lease refuses durations below 1µs itself (ErrInvalidInput, no
	// round trip), wait 0 excepted.
	clientSide := takesTTL && ttl < time.Microsecond || op == opAcquireWait && wait < time.Microsecond && wait != 0
	if takesTTL && r.maxTTLSeconds > 0 && ttl.Seconds() > r.maxTTLSeconds {
		vs.add("ttl", "ttl is above max_ttl", invalid)
	}
	if unrep || vs.verdict != valid {
		pre = preNone // the starting state needs a valid key and owner
	}

	// The starting state.
	other := "fuzz-other"
	if owner == other {
		other = "fuzz-other-2"
	}
	h.reset(t, key)
	var cur int64 // the key's epoch (or counter) after the setup; 0: no row
	setup := func(o string, ttl time.Duration) (lease.Grant, bool) {
		g, ok, err := c.Acquire(ctx, key, o, ttl)
		if err != nil && r.payloadOverflow && isPayloadOverflow(err) {
			return g, false // known deviation: this key cannot be granted at all
		}
		if err != nil || !ok {
			t.Fatalf("setup (%s): acquire %q by %q: ok=%v err=%v", preNames[pre], key, o, ok, err)
		}
		return g, true
	}
	switch pre {
	case preHeld, preOther, preFree, preLapsed:
		holder, d := owner, time.Hour
		if pre == preOther {
			holder = other
		}
		if pre == preLapsed {
			d = time.Microsecond
		}
		g, ok := setup(holder, d)
		if !ok {
			pre = preNone
			break
		}
		cur = g.Epoch
		if pre == preFree {
			if err := c.Release(ctx, g.Token); err != nil {
				if r.payloadOverflow && isPayloadOverflow(err) {
					pre = preHeld
					break
				}
				t.Fatalf("setup: release: %v", err)
			}
			cur++
		}
		if pre == preLapsed {
			for {
				s, err := c.Inspect(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if !s.Held {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	epoch := cur + epochDelta
	if takesEpoch {
		vs.epoch(r, &epoch)
	}
	tok := lease.Token{Key: key, Owner: owner, Epoch: epoch}
	if op == opAcquireWait && pre == preOther && wait > 20*time.Millisecond {
		wait = wait%(20*time.Millisecond) + time.Microsecond // a denied wait ends soon
	}
	t.Logf("%s from %q: key %s owner %s epoch %d (cur %d) ttl %v wait %v", opNames[op], preNames[pre], show(&key), show(&owner), epoch, cur, ttl, wait)

	before := h.snapshot(t)
	var (
		err      error
		g        lease.Grant
		ok       bool
		st       lease.State
		list     []lease.State
		released bool
		prev     string
		fepoch   int64
	)
	switch op {
	case opAcquire:
		g, ok, err = c.Acquire(ctx, key, owner, ttl)
	case opAcquireWait:
		g, err = c.AcquireWait(ctx, key, owner, ttl, wait)
		ok = err == nil
	case opRenew:
		g, err = c.Renew(ctx, tok, ttl)
	case opRelease:
		err = c.Release(ctx, tok)
	case opInspect:
		st, err = c.Inspect(ctx, key)
	case opList:
		list, err = c.List(ctx)
	case opFence:
		tx, berr := h.pool.Begin(ctx)
		if berr != nil {
			t.Fatal(berr)
		}
		_, err = lease.Fence(ctx, tx, tok)
		if rerr := tx.Rollback(ctx); rerr != nil {
			t.Fatal(rerr)
		}
	case opForceRelease:
		released, prev, fepoch, err = leaseadmin.ForceRelease(ctx, c, key)
	}

	// Refusals: nothing may have changed.
	switch {
	case clientSide:
		checkInvalid(t, err, []string{"ttl or wait"}, true, true)
		h.unchanged(t, before, "a refused call")
		return
	case unrep:
		if unrepresentableCode != "" {
			if pg := pgErr(err); pg == nil || pg.Code != unrepresentableCode {
				t.Fatalf("unrepresentable key/owner: %v, want the known SQLSTATE %s", err, unrepresentableCode)
			}
		} else {
			checkInvalid(t, err, nil, true, true)
		}
		h.unchanged(t, before, "a refused call")
		return
	case vs.verdict == invalid:
		checkInvalid(t, err, vs.names, true, false)
		h.unchanged(t, before, "an invalid call")
		return
	}

	// A valid call: a result consistent with the starting state.
	lost := func(want error) {
		t.Helper()
		if want == nil {
			if err != nil {
				t.Fatalf("%s: %v, want success", opNames[op], err)
			}
			return
		}
		if !errors.Is(err, want) || !errors.Is(err, lease.ErrLost) {
			t.Fatalf("%s: %v, want %v (and ErrLost)", opNames[op], err, want)
		}
		h.unchanged(t, before, "a failed "+opNames[op])
	}
	status := func() error { // renew, release, fence: what the starting state calls for
		switch pre {
		case preHeld:
			if epoch != cur {
				return lease.ErrEpochMismatch
			}
			return nil
		case preLapsed:
			return lease.ErrLapsed
		}
		return lease.ErrNotOwner
	}
	payload := func(event, o string, e int64) bool { // a known payload overflow, nothing changed
		if r.payloadOverflow && payloadVerdict(payloadLen(event, key, o, e)) != valid && isPayloadOverflow(err) {
			h.unchanged(t, before, "a notification too long")
			return true
		}
		return false
	}
	switch op {
	case opAcquire, opAcquireWait:
		want := map[uint8]int64{preHeld: cur, preFree: cur + 1, preLapsed: cur + 1}[pre]
		if pre != preHeld && payload("acquired", owner, max(want, 1)) {
			return
		}
		if pre == preOther {
			switch {
			case op == opAcquire && err == nil && !ok:
			case op == opAcquireWait && errors.Is(err, lease.ErrWaitTimeout):
			case op == opAcquireWait && wait == 0 && acquireWaitZeroUntyped && err != nil && strings.Contains(err.Error(), "no grant"):
			default:
				t.Fatalf("%s of a key held by another: ok=%v err=%v", opNames[op], ok, err)
			}
			h.unchanged(t, before, "a denied acquire")
			return
		}
		if err != nil || !ok {
			t.Fatalf("%s from %s: ok=%v err=%v, want a grant", opNames[op], preNames[pre], ok, err)
		}
		if g.Key != key || g.Owner != owner || g.Epoch < 1 || (want != 0 && g.Epoch != want) {
			t.Fatalf("%s from %s: grant %v, want epoch %d", opNames[op], preNames[pre], g.Token, want)
		}
		h.checkHeld(t, key, owner, g.Epoch, ttl)
	case opRenew:
		lost(status())
		if err == nil {
			if g.Epoch != cur {
				t.Fatalf("renew changed the epoch: %v", g.Token)
			}
			h.checkHeld(t, key, owner, cur, ttl)
		}
	case opRelease:
		if status() == nil && payload("released", owner, epoch) {
			return
		}
		lost(status())
		if err == nil {
			s, err := c.Inspect(ctx, key)
			if err != nil || s.Held || s.Epoch != cur+1 {
				t.Fatalf("after release: %+v, %v; want free with counter %d", s, err, cur+1)
			}
		}
	case opFence:
		lost(status())
		h.unchanged(t, before, "a fence (rolled back)")
	case opInspect:
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		h.checkState(t, st, pre, owner, other, cur)
	case opList:
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var found *lease.State
		for i := range list {
			if list[i].Key == key {
				found = &list[i]
			}
		}
		if found == nil {
			found = &lease.State{Key: key}
		}
		h.checkState(t, *found, pre, owner, other, cur)
	case opForceRelease:
		holder := map[uint8]string{preHeld: owner, preOther: other, preLapsed: owner}[pre]
		if holder != "" && payload("force_released", holder, cur) {
			return
		}
		if err != nil {
			t.Fatalf("force_release: %v", err)
		}
		want := cur
		if holder != "" {
			want = cur + 1
		}
		if released != (holder != "") || prev != holder || fepoch != want {
			t.Fatalf("force_release from %s: released=%v previous=%q epoch=%d; want %v %q %d",
				preNames[pre], released, prev, fepoch, holder != "", holder, want)
		}
		if holder == "" {
			h.unchanged(t, before, "a force_release that released nothing")
		}
	}
}

// checkHeld: inspect reports key held by owner at epoch (unless the ttl is
// too short to still be running).
func (h *harness) checkHeld(t *testing.T, key, owner string, epoch int64, ttl time.Duration) {
	t.Helper()
	s, err := h.client.Inspect(ctxFor(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || s.Epoch != epoch || (ttl > time.Minute && (!s.Held || s.Owner != owner)) {
		t.Fatalf("after the grant: %+v, want held by %q at epoch %d", s, owner, epoch)
	}
}

// checkState: an inspect or list entry agrees with the starting state.
func (h *harness) checkState(t *testing.T, s lease.State, pre uint8, owner, other string, cur int64) {
	t.Helper()
	wantHeld := pre == preHeld || pre == preOther
	wantOwner := map[uint8]string{preHeld: owner, preOther: other}[pre]
	if s.Exists != (pre != preNone) || s.Held != wantHeld || s.Owner != wantOwner || s.Epoch != cur {
		t.Fatalf("state from %s: %+v; want exists=%v held=%v owner=%q epoch=%d",
			preNames[pre], s, pre != preNone, wantHeld, wantOwner, cur)
	}
}

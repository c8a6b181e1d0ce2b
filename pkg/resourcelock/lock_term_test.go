package resourcelock_test

// The lock's terms: loss, deadlines, events and tokens.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// fakeClockDB starts a server of the test's own whose clock the test moves.
func fakeClockDB(t *testing.T) (*pgtest.Server, string) {
	t.Helper()
	ctx := context.Background()
	s := pgtest.New(t, pgtest.Options{FakeClock: true})
	if err := s.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := s.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newPool(t, dsn).Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return s, dsn
}

// hookLog records OnEpochChange calls and checks the epoch-change rule: an
// end is reported after the term's context is done, and no start comes while
// another term of the same lock is live.
type hookLog struct {
	t     *testing.T
	mu    sync.Mutex
	calls [][2]lease.Token
	live  *lease.Token
}

func (h *hookLog) hook() func(old, new lease.Token) {
	return func(old, new lease.Token) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.calls = append(h.calls, [2]lease.Token{old, new})
		switch {
		case new.Epoch != 0:
			if h.live != nil {
				h.t.Errorf("epoch %d handed out while epoch %d is live", new.Epoch, h.live.Epoch)
			}
			h.live = &new
		case old.Epoch != 0:
			if h.live == nil || *h.live != old {
				h.t.Errorf("end of %v reported, live is %v", old, h.live)
			}
			h.live = nil
		}
	}
}

func (h *hookLog) snapshot() [][2]lease.Token {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][2]lease.Token(nil), h.calls...)
}

// After lapsed, not_owner or epoch_mismatch the lock never reports success
// for the old epoch again: the Update that hears it returns Conflict (and
// the lease error), the term's context is cancelled with that cause before
// OnEpochChange reports the end, and the next successful Update carries a
// new, greater epoch, reported only after the end.
func TestNoSuccessForALostEpoch(t *testing.T) {
	srv, dsn := fakeClockDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	var offset time.Duration
	jump := func() { // make the server's clock pass every expiry of the test
		offset += 2 * time.Hour
		if err := srv.SetClockOffset(offset); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = time.Hour
	hl := &hookLog{t: t}
	a := mustLock(t, newClient(t, dsn), "k", "a", resourcelock.Config{LeaseDuration: ttl,
		OnEpochChange: hl.hook()})
	// Another process that (wrongly) shares the identity, for epoch_mismatch.
	twin := mustLock(t, newClient(t, dsn), "k", "a", resourcelock.Config{LeaseDuration: ttl})
	if _, _, err := twin.Get(ctx); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}

	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		lose  func()
		after func() // between the Conflict and the next Update
		want  error
		epoch func(old int64) int64 // the epoch the next Update gets
	}{
		{"lapsed", jump, nil, lease.ErrLapsed, func(old int64) int64 { return old + 1 }},
		{"not_owner", func() {
			if ok, _, _, err := leaseadmin.ForceRelease(ctx, admin, "k"); err != nil || !ok {
				t.Fatalf("force_release: %v %v", ok, err)
			}
		}, nil, lease.ErrNotOwner, func(old int64) int64 { return old + 2 }},
		{"epoch_mismatch", func() {
			jump()
			if err := twin.Update(ctx, rec("a")); err != nil { // takes over the lapsed grant
				t.Fatal(err)
			}
		}, func() {
			if err := twin.Update(ctx, rec("")); err != nil {
				t.Fatal(err)
			}
		}, lease.ErrEpochMismatch, func(old int64) int64 { return old + 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			term := resourcelock.TermOf(a)
			if term == nil {
				t.Fatal("no live term before the loss")
			}
			old := term.Grant().Token
			tctx, cancel, err := a.TokenContext(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer cancel()
			if tok, _ := lease.TokenFromContext(tctx); tok != old {
				t.Fatalf("TokenContext carries %v, want %v", tok, old)
			}
			tc.lose()
			err = a.Update(ctx, rec("a")) // client-go's renew
			if !apierrors.IsConflict(err) || !errors.Is(err, tc.want) {
				t.Fatalf("renew after %s: %v, want Conflict matching %v", tc.name, err, tc.want)
			}
			if !errors.Is(term.Err(), tc.want) || !errors.Is(context.Cause(tctx), tc.want) {
				t.Fatalf("term ended with %v, token context with %v, want %v", term.Err(), context.Cause(tctx), tc.want)
			}
			if epochOf(a) != 0 {
				t.Fatalf("Epoch() = %d after the loss", epochOf(a))
			}
			if _, ok := a.Token(); ok {
				t.Fatal("Token() still reports a token")
			}
			if _, _, err := a.TokenContext(ctx); !errors.Is(err, resourcelock.ErrNotHolding) {
				t.Fatalf("TokenContext after the loss: %v", err)
			}
			if tc.after != nil {
				tc.after()
			}
			// The same identity asks again: a new epoch, never the old one.
			if err := a.Update(ctx, rec("a")); err != nil {
				t.Fatalf("re-acquire: %v", err)
			}
			if got, want := epochOf(a), tc.epoch(old.Epoch); got != want {
				t.Fatalf("re-acquired epoch %d, want %d", got, want)
			}
			calls := hl.snapshot()
			n := len(calls)
			if n < 2 || calls[n-2] != [2]lease.Token{old, {}} || calls[n-1][0] != (lease.Token{}) || calls[n-1][1].Epoch != epochOf(a) {
				t.Fatalf("OnEpochChange calls %v, want ... (%v, 0), (0, epoch %d)", calls, old, epochOf(a))
			}
		})
	}
	t.Logf("OnEpochChange calls: %v", hl.snapshot())
}

// A Get that sees our grant gone ends the term at once, before any Update.
func TestGetSeesLoss(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	a := mustLock(t, newClient(t, dsn), "k", "a")
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	term := resourcelock.TermOf(a)
	if _, _, _, err := leaseadmin.ForceRelease(ctx, admin, "k"); err != nil {
		t.Fatal(err)
	}
	get(t, a)
	if !errors.Is(term.Err(), lease.ErrNotOwner) || epochOf(a) != 0 {
		t.Fatalf("after Get saw the key free: term err %v, epoch %d", term.Err(), epochOf(a))
	}
}

// A term ends at its local deadline (ValidUntil - Margin) when no renewal
// moves it, and the grant is then given back rather than resumed.
func TestLocalDeadlineEndsTerm(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	a, _ := createInTime(t, dsn, "k", "a", resourcelock.Config{LeaseDuration: time.Second, Margin: 200 * time.Millisecond})
	term := resourcelock.TermOf(a)
	<-term.Done()
	if !errors.Is(term.Err(), lease.ErrLocalDeadline) {
		t.Fatalf("term ended with %v", term.Err())
	}
	if resourcelock.TermOf(a) != nil || epochOf(a) != 0 {
		t.Fatal("an ended term is still handed out")
	}
	s, _ := admin.Inspect(ctx, "k")
	t.Logf("term ended at its local deadline (%v ago); server: held=%v epoch=%d", time.Since(term.Deadline()), s.Held, s.Epoch)
	err := a.Update(ctx, rec("a"))
	if !apierrors.IsConflict(err) || !errors.Is(err, lease.ErrLocalDeadline) {
		t.Fatalf("renew after the local deadline: %v, want Conflict", err)
	}
	if err := a.Update(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	if epochOf(a) <= 1 {
		t.Fatalf("after the local deadline the lock resumed epoch %d", epochOf(a))
	}
}

// lateTimers is a fake clock whose AfterFunc timers never fire: a term's
// deadline timer that has not run yet, as on a loaded machine.
type lateTimers struct {
	*clocktesting.FakeClock
	never *clocktesting.FakeClock
}

func (c lateTimers) AfterFunc(d time.Duration, f func()) clock.Timer { return c.never.AfterFunc(d, f) }

// Once a term's local deadline has passed, the lock ends it with
// lease.ErrLocalDeadline whatever notices it first: the renewal client-go
// asks for, or a release, before the deadline timer has run. Never
// "released by the holder" for a term whose deadline passed.
func TestDeadlinePassedBeforeItsTimer(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	for _, release := range []bool{false, true} {
		clk := clocktesting.NewFakeClock(time.Now())
		c := newClient(t, dsn).WithClock(lateTimers{FakeClock: clk, never: clocktesting.NewFakeClock(clk.Now())})
		key := fmt.Sprintf("late-%v", release)
		a := mustLock(t, c, key, "a", resourcelock.Config{LeaseDuration: 10 * time.Second})
		if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err := a.Create(ctx, rec("a")); err != nil {
			t.Fatal(err)
		}
		term := resourcelock.TermOf(a)
		tctx, cancel, err := a.TokenContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		clk.SetTime(term.Deadline()) // its timer does not run
		if term.Err() != nil {
			t.Fatal("the deadline timer ran")
		}
		ler := rec("a")
		if release {
			ler.HolderIdentity = ""
		}
		err = a.Update(ctx, ler)
		if !release && (!apierrors.IsConflict(err) || !errors.Is(err, lease.ErrLocalDeadline)) {
			t.Fatalf("renew after the deadline: %v, want Conflict (local deadline)", err)
		}
		if release && err != nil {
			t.Fatalf("release after the deadline: %v", err)
		}
		if !errors.Is(term.Err(), lease.ErrLocalDeadline) || !errors.Is(context.Cause(tctx), lease.ErrLocalDeadline) {
			t.Fatalf("release=%v: term ended with %v (context %v), want the local deadline", release, term.Err(), context.Cause(tctx))
		}
		// Either way the grant was given back: the key is free.
		if s, err := c.Inspect(ctx, key); err != nil || s.Held {
			t.Fatalf("release=%v: after the give-back: %+v, %v", release, s, err)
		}
	}
}

func TestRecordEvent(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	r := record.NewFakeRecorder(10)
	a := mustLock(t, newClient(t, dsn), "k", "a", resourcelock.Config{EventRecorder: r})
	a.RecordEvent("stopped leading")
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	a.RecordEvent("became leader")
	for _, want := range []string{"Normal LeaderElection a stopped leading", "Normal LeaderElection a became leader (epoch 1)"} {
		if got := <-r.Events; got != want {
			t.Errorf("event %q, want %q", got, want)
		}
	}
	mustLock(t, newClient(t, dsn), "k", "b").RecordEvent("no recorder: no panic")
}

// SetEventRecorder moves the events to a recorder made after the lock, about
// the Lease named after the key: "namespace/name" split, else a name in the
// namespace given.
func TestSetEventRecorder(t *testing.T) {
	dsn := newDB(t)
	for _, tc := range []struct{ key, ns, wantNS, wantName string }{
		{"ns/op", "other", "ns", "op"},
		{"op", "other", "other", "op"},
	} {
		first := record.NewFakeRecorder(10)
		l := mustLock(t, newClient(t, dsn), tc.key, "a", resourcelock.Config{EventRecorder: first})
		later := &objectRecorder{}
		l.SetEventRecorder(later, tc.ns)
		l.RecordEvent("became leader")
		if len(first.Events) != 0 {
			t.Errorf("%s: the first recorder still got %q", tc.key, <-first.Events)
		}
		lease, ok := later.obj.(*coordinationv1.Lease)
		if !ok || lease.Namespace != tc.wantNS || lease.Name != tc.wantName || later.msg != "a became leader" {
			t.Errorf("%s: event %q about %#v, want a Lease %s/%s", tc.key, later.msg, later.obj, tc.wantNS, tc.wantName)
		}
	}
}

// objectRecorder keeps the last event and what it was about.
type objectRecorder struct {
	obj runtime.Object
	msg string
}

func (r *objectRecorder) Eventf(obj runtime.Object, _, _, format string, args ...any) {
	r.obj, r.msg = obj, fmt.Sprintf(format, args...)
}

// TokenContext keeps the caller's values, carries the term's token, ends
// with the term (synchronously, with its cause) or with its parent.
func TestTokenContext(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	a := mustLock(t, newClient(t, dsn), "k", "a")
	if _, _, err := a.TokenContext(ctx); !errors.Is(err, resourcelock.ErrNotHolding) {
		t.Fatalf("before any grant: %v", err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	type k struct{}
	parent, cancelParent := context.WithCancel(context.WithValue(ctx, k{}, "v"))
	c1, cancel1, err := a.TokenContext(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel1()
	child, cancelChild := context.WithCancel(c1)
	defer cancelChild()
	if tok, ok := lease.TokenFromContext(child); !ok || tok.Epoch != 1 || tok.Owner != "a" || child.Value(k{}) != "v" {
		t.Fatalf("token %v %v, value %v", tok, ok, child.Value(k{}))
	}
	c2, cancel2, err := a.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	cancelParent()
	<-c1.Done()
	if c2.Err() != nil {
		t.Fatal("cancelling one caller's context ended another")
	}
	if err := a.Update(ctx, rec("")); err != nil {
		t.Fatal(err)
	}
	// Synchronous: done as soon as the release returned.
	if !errors.Is(context.Cause(c2), lease.ErrReleased) {
		t.Fatalf("after release: cause %v", context.Cause(c2))
	}
}

// lease.cleanup removes keys free for long enough: Get then says NotFound
// (client-go calls Create), a grant the lock still had is dropped, and
// Create succeeds with an epoch above every earlier one.
func TestKeyRemovedByCleanup(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newPool(t, dsn)
	a, _ := createInTime(t, dsn, "k", "a", resourcelock.Config{LeaseDuration: 2 * time.Second})
	pgtest.WaitLapsed(t, lease.New(admin), "k", time.Minute)
	var removed, floor int64
	if err := admin.QueryRow(ctx, `SELECT removed, epoch_floor FROM lease.cleanup('0')`).Scan(&removed, &floor); err != nil || removed != 1 {
		t.Fatalf("cleanup: removed %d, floor %d, %v", removed, floor, err)
	}
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a removed key: %v, want NotFound", err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatalf("Create of a removed key: %v", err)
	}
	if epochOf(a) <= 1 || epochOf(a) <= floor {
		t.Fatalf("re-created at epoch %d (floor %d), want above every earlier epoch", epochOf(a), floor)
	}
}

// Check fails only while the lock holds a grant that its elector stopped
// calling about for over twice the lease duration.
func TestCheckDetectsAStuckElector(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	if err := mustLock(t, newClient(t, dsn), "k", "a", resourcelock.Config{LeaseDuration: time.Second}).Check(nil); err != nil {
		t.Fatalf("Check with no grant: %v", err)
	}
	// Check right after the grant passes unless the grant's own call began
	// over twice the lease duration before Check (a loaded machine): then
	// the grant is given back and made again, twice as long.
	var a *resourcelock.Lock
	for cfg := (resourcelock.Config{LeaseDuration: time.Second, Margin: 100 * time.Millisecond}); ; {
		var called time.Time
		a, called = createInTime(t, dsn, "k", "a", cfg)
		err := a.Check(nil)
		if err == nil {
			break
		}
		if time.Since(called) <= 2*resourcelock.LeaseDuration(a) {
			t.Fatalf("Check right after the grant: %v", err)
		}
		t.Logf("Check came %v after the grant's call began: again with a longer one", time.Since(called))
		if err := a.Update(ctx, rec("")); err != nil { // release
			t.Fatal(err)
		}
		cfg.LeaseDuration, cfg.Margin = 2*resourcelock.LeaseDuration(a), 2*resourcelock.MarginOf(a)
	}
	// No call for over twice the lease duration: a stuck elector.
	time.Sleep(2*resourcelock.LeaseDuration(a) + 100*time.Millisecond)
	if err := a.Check(nil); err == nil {
		t.Fatal("Check passed although the elector left a held grant alone for > 2 x lease duration")
	}
	// The elector comes back: its Get sees the lapse, the lock drops the
	// grant, and the check passes again.
	if _, _, err := a.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(nil); err != nil {
		t.Fatalf("Check after the elector saw the lapse: %v", err)
	}
}

// createInTime makes a lock with cfg and its grant of key (Create, or Get
// then Update when the key exists). A grant answered past its local
// deadline is of no use to a test of what follows: then a new lock whose
// LeaseDuration and Margin are twice as long takes the key. It returns the
// lock and when its first call for that grant began.
func createInTime(t *testing.T, dsn, key, id string, cfg resourcelock.Config) (*resourcelock.Lock, time.Time) {
	t.Helper()
	ctx := context.Background()
	for {
		l := mustLock(t, newClient(t, dsn), key, id, cfg)
		called := time.Now()
		err := l.Create(ctx, rec(id))
		if apierrors.IsAlreadyExists(err) {
			called = time.Now()
			if _, _, err = l.Get(ctx); err == nil {
				err = l.Update(ctx, rec(id))
			}
		}
		if err == nil {
			return l, called
		}
		if !errors.Is(err, lease.ErrLocalDeadline) {
			t.Fatal(err)
		}
		t.Logf("the grant of %v came past its local deadline; again with a longer one", cfg.LeaseDuration)
		cfg.LeaseDuration, cfg.Margin = 2*cfg.LeaseDuration, 2*cfg.Margin
	}
}

// epochOf is the epoch of l's live term, 0 when there is none.
func epochOf(l *resourcelock.Lock) int64 {
	if t := resourcelock.TermOf(l); t != nil {
		return t.Grant().Epoch
	}
	return 0
}

// TestUpdateBeforeGetRefused: client-go always reads the record before it
// writes; an Update of a lock that never looked at the key (no Get, no
// Create) is refused and changes nothing, instead of acquiring.
func TestUpdateBeforeGetRefused(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	a := mustLock(t, newClient(t, dsn), "k", "a")
	if err := a.Update(ctx, rec("a")); !apierrors.IsBadRequest(err) {
		t.Fatalf("Update before Get: %v, want BadRequest", err)
	}
	if s, err := newClient(t, dsn).Inspect(ctx, "k"); err != nil || s.Exists {
		t.Fatalf("after a refused Update: %+v, %v", s, err)
	}
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := a.Update(ctx, rec("a")); err != nil || epochOf(a) != 1 {
		t.Fatalf("Update after Get: %v (epoch %d)", err, epochOf(a))
	}
}

// lateAnswers steps clk by step when the first acquire's answer is read:
// the call took that long (its commit waited for a new primary's first
// commit, say).
type lateAnswers struct {
	lease.Querier
	clk     *clocktesting.FakeClock
	step    time.Duration
	stepped bool
}

func (q *lateAnswers) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r := q.Querier.QueryRow(ctx, sql, args...)
	if q.stepped || !strings.Contains(sql, "lease.acquire(") {
		return r
	}
	q.stepped = true
	return lateRow{r, q}
}

type lateRow struct {
	pgx.Row
	q *lateAnswers
}

func (r lateRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.q.clk.Step(r.q.step)
	return err
}

// A grant whose answer came with little of its TTL left (the call waited
// most of it) is renewed at once: the term handed out has a whole lease
// duration, not what is left until the next renewal client-go sends a
// RetryPeriod later. One whose answer came after its local deadline is
// given back and the key asked for again at once: the term handed out is
// a new epoch's, and Create or Update succeeds instead of leaving the key
// to client-go's next RetryPeriod.
func TestLateGrantRenewedAtOnce(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	const ttl = time.Minute
	for _, tc := range []struct {
		op   string
		step time.Duration
	}{{"Create", ttl - 5*time.Second}, {"Update", ttl - 5*time.Second}, {"Create", ttl + time.Second}, {"Update", ttl + time.Second}} {
		op := tc.op
		clk := clocktesting.NewFakeClock(time.Now())
		key := fmt.Sprintf("late-%s-%v", op, tc.step)
		c := lease.New(&lateAnswers{Querier: newPool(t, dsn), clk: clk, step: tc.step}).WithClock(clk)
		a := mustLock(t, c, key, "a", resourcelock.Config{LeaseDuration: ttl})
		if op == "Update" {
			// A key that exists and is free: Update acquires it.
			admin := newClient(t, dsn)
			g, ok, err := admin.Acquire(ctx, key, "b", ttl)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			if err := admin.Release(ctx, g.Token); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := a.Get(ctx); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		var err error
		if op == "Create" {
			err = a.Create(ctx, rec("a"))
		} else {
			err = a.Update(ctx, rec("a"))
		}
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		term := resourcelock.TermOf(a)
		if term == nil {
			t.Fatalf("%s: no live term", op)
		}
		if left := term.Deadline().Sub(clk.Now()); left < ttl/2 {
			t.Fatalf("%s after %v: the term handed out ends in %v, want at least half the lease duration (%v)", op, tc.step, left, ttl/2)
		}
		if s, err := c.Inspect(ctx, key); err != nil || !s.Held || s.Epoch != term.Grant().Epoch {
			t.Fatalf("%s after %v: the server shows %+v (%v), want the term's grant %v", op, tc.step, s, err, term.Grant().Token)
		}
	}
}

// client-go's elector records "stopped leading" when its leadership ends,
// which a renewal failing for RenewDeadline can do while the grant is
// still valid. The lock ends the term then (its contexts are done with
// ErrStoppedLeading), gives the grant back at the next Update, and the
// next leadership of the same identity carries a new epoch, never the one
// under which the old leadership may still act.
func TestStoppedLeadingEndsTheTerm(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	c := newClient(t, dsn)
	a := mustLock(t, c, "stopped", "a")
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	first := epochOf(a)
	tctx, cancel, err := a.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()

	a.RecordEvent("stopped leading")
	if !errors.Is(context.Cause(tctx), resourcelock.ErrStoppedLeading) {
		t.Fatalf("token context after stopped leading: %v, want ErrStoppedLeading", context.Cause(tctx))
	}
	if _, ok := a.Token(); ok {
		t.Fatal("a token after stopped leading")
	}
	// A new elector of the same identity: Get, then Update.
	if _, _, err := a.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, rec("a")); !apierrors.IsConflict(err) {
		t.Fatalf("Update of the ended term: %v, want Conflict (given back)", err)
	}
	if s, err := c.Inspect(ctx, "stopped"); err != nil || s.Held {
		t.Fatalf("after the give-back: %+v, %v", s, err)
	}
	if _, _, err := a.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	if e := epochOf(a); e <= first {
		t.Fatalf("leading again with epoch %d after stopped leading at epoch %d", e, first)
	}
}

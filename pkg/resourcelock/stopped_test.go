package resourcelock_test

// "stopped leading": client-go's elector ends its leadership, and the
// lock's term with it, in the order its renew loop does (release on
// cancel, then the event), with real electors and injected failures.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

var errInjected = errors.New("injected failure")

// gated is a Querier that fails the calls whose SQL contains fail, and
// holds those whose SQL contains hold until the test lets them go.
type gated struct {
	lease.Querier
	mu      sync.Mutex
	fail    string
	hold    string
	held    chan struct{} // a held call arrived
	proceed chan struct{} // closed: held calls proceed
}

func newGated(q lease.Querier) *gated {
	return &gated{Querier: q, held: make(chan struct{}, 10), proceed: make(chan struct{})}
}

func (g *gated) set(fail, hold string) {
	g.mu.Lock()
	g.fail, g.hold = fail, hold
	g.mu.Unlock()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (g *gated) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	g.mu.Lock()
	fail, hold := g.fail, g.hold
	g.mu.Unlock()
	if fail != "" && strings.Contains(sql, fail) {
		return errRow{errInjected}
	}
	if hold != "" && strings.Contains(sql, hold) {
		g.held <- struct{}{}
		select {
		case <-g.proceed:
		case <-ctx.Done():
			return errRow{ctx.Err()}
		}
	}
	return g.Querier.QueryRow(ctx, sql, args...)
}

// stoppedLock is a lock on a gated pool with a hook log, for the elector
// timings of these tests.
func stoppedLock(t *testing.T, dsn, key string) (*resourcelock.Lock, *gated, *hookLog) {
	g := newGated(newPool(t, dsn))
	hl := &hookLog{t: t}
	l := mustLock(t, lease.New(g), key, "a", resourcelock.Config{LeaseDuration: testTTL, OnEpochChange: hl.hook()})
	return l, g, hl
}

func wantCalls(t *testing.T, hl *hookLog, want ...[2]int64) {
	t.Helper()
	got := hl.snapshot()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i][0].Epoch == want[i][0] && got[i][1].Epoch == want[i][1]
	}
	if !ok {
		t.Fatalf("OnEpochChange calls %v, want (old, new) epochs %v", got, want)
	}
}

// wantNextLeadership runs a new elector on lock after a leadership under
// first ended: it must lead under a new epoch, reported once after the end.
func wantNextLeadership(t *testing.T, lock *resourcelock.Lock, hl *hookLog, first lease.Token, releaseOnCancel bool) {
	t.Helper()
	c := runCandidate(t, lock, releaseOnCancel)
	second := <-c.started
	if second.Epoch <= first.Epoch {
		t.Fatalf("the next leadership of the same lock: %v after %v, want a new epoch", second, first)
	}
	wantCalls(t, hl, [2]int64{0, first.Epoch}, [2]int64{first.Epoch, 0}, [2]int64{0, second.Epoch})
}

// A leader stops without releasing (ReleaseOnCancel false, as a
// kubebuilder manager's shutdown): its term ends when client-go records
// "stopped leading", once; the grant stays on the server (nobody
// released it); a new elector on the same lock gives it back and leads
// under a new epoch.
func TestStoppedLeadingWithoutRelease(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	lock, _, hl := stoppedLock(t, dsn, "norelease")
	c := runCandidate(t, lock, false)
	first := <-c.started
	tctx, cancel, err := lock.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	c.stop()
	if cause := context.Cause(tctx); !errors.Is(cause, resourcelock.ErrStoppedLeading) {
		t.Fatalf("after Run returned: the term's context: %v, want ErrStoppedLeading", cause)
	}
	if _, ok := lock.Token(); ok {
		t.Fatal("a token after client-go stopped leading")
	}
	wantCalls(t, hl, [2]int64{0, first.Epoch}, [2]int64{first.Epoch, 0})
	if s, err := admin.Inspect(ctx, "norelease"); err != nil || !s.Held || s.Epoch != first.Epoch {
		t.Fatalf("no release on cancel: the grant should still be held: %+v, %v", s, err)
	}

	wantNextLeadership(t, lock, hl, first, false)
}

// With ReleaseOnCancel client-go releases before it records "stopped
// leading": a release that worked ends the term as a release (once) and
// frees the key at once. A release that failed at its Get leaves the term
// to the event; one that failed at the server's call had ended the term
// already. Either way OnEpochChange hears of the end once, and the next
// leadership of the same lock gives the grant back and gets a new epoch.
func TestStoppedLeadingAfterReleaseOnCancel(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	for _, tc := range []struct {
		name  string
		fail  string // the SQL that fails during the release
		cause error  // the term's cause
		held  bool   // the grant is still held after Run returned
	}{
		{"released", "", lease.ErrReleased, false},
		{"get fails", "lease.inspect(", resourcelock.ErrStoppedLeading, true},
		{"release fails", "lease.release(", lease.ErrReleased, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.ReplaceAll(tc.name, " ", "-")
			lock, g, hl := stoppedLock(t, dsn, key)
			c := runCandidate(t, lock, true)
			first := <-c.started
			tctx, cancel, err := lock.TokenContext(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer cancel()
			g.set(tc.fail, "")
			c.stop()
			g.set("", "")
			if cause := context.Cause(tctx); !errors.Is(cause, tc.cause) {
				t.Fatalf("the term's context: %v, want %v", cause, tc.cause)
			}
			wantCalls(t, hl, [2]int64{0, first.Epoch}, [2]int64{first.Epoch, 0})
			s, err := admin.Inspect(ctx, key)
			if err != nil || s.Held != tc.held {
				t.Fatalf("after Run returned: %+v, %v; want held=%v", s, err, tc.held)
			}
			wantNextLeadership(t, lock, hl, first, true)
		})
	}
}

// "stopped leading" arrives while a renewal is in flight (RecordEvent does
// not wait for Get, Create or Update): the term ends at once, the renewal
// that the server then grants neither revives nor extends it, and that
// Update gives the grant back.
func TestStoppedLeadingDuringRenewal(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	lock, g, hl := stoppedLock(t, dsn, "inflight")
	if err := lock.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	first := epochOf(lock)
	tctx, cancel, err := lock.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	g.set("", "lease.renew(")
	done := make(chan error, 1)
	go func() { done <- lock.Update(ctx, rec("a")) }()
	<-g.held
	lock.RecordEvent("stopped leading")
	if cause := context.Cause(tctx); !errors.Is(cause, resourcelock.ErrStoppedLeading) {
		t.Fatalf("during the renewal: %v, want ErrStoppedLeading", cause)
	}
	g.set("", "")
	close(g.proceed)
	if err := <-done; !apierrors.IsConflict(err) {
		t.Fatalf("the renewal in flight: %v, want Conflict (the grant given back)", err)
	}
	if _, ok := lock.Token(); ok {
		t.Fatal("the renewal revived the ended term")
	}
	if s, err := admin.Inspect(ctx, "inflight"); err != nil || s.Held {
		t.Fatalf("after the renewal in flight: %+v, %v, want the grant given back", s, err)
	}
	wantCalls(t, hl, [2]int64{0, first}, [2]int64{first, 0})
}

// A term whose local deadline has passed ends with lease.ErrLocalDeadline
// whatever notices it first, "stopped leading" included, before the
// deadline timer has run.
func TestStoppedLeadingAfterTheDeadline(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	c := newClient(t, dsn).WithClock(lateTimers{FakeClock: clk, never: clocktesting.NewFakeClock(clk.Now())})
	a := mustLock(t, c, "late-stopped", "a", resourcelock.Config{LeaseDuration: 10 * time.Second})
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	term := resourcelock.TermOf(a)
	clk.SetTime(term.Deadline()) // its timer does not run
	if term.Err() != nil {
		t.Fatal("the deadline timer ran")
	}
	a.RecordEvent("stopped leading")
	if !errors.Is(term.Err(), lease.ErrLocalDeadline) {
		t.Fatalf("stopped leading after the deadline: the term ended with %v, want the local deadline", term.Err())
	}
}

// The Update that gives back the grant of a term that "stopped leading"
// ended before its deadline says so: its Conflict carries the term's
// cause, not the local deadline, which had not passed.
func TestGiveBackNamesTheCause(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	a := mustLock(t, newClient(t, dsn), "giveback", "a", resourcelock.Config{LeaseDuration: time.Minute})
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	a.RecordEvent("stopped leading")
	if _, _, err := a.Get(ctx); err != nil {
		t.Fatal(err)
	}
	err := a.Update(ctx, rec("a"))
	if !apierrors.IsConflict(err) || !errors.Is(err, resourcelock.ErrStoppedLeading) || errors.Is(err, lease.ErrLocalDeadline) {
		t.Fatalf("give-back of a term that stopped leading: %v, want Conflict with ErrStoppedLeading, not the local deadline", err)
	}
}

package resourcelock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// TestEndReportedBeforeTheLockActs: the local deadline's timer ends a term
// and reports it to OnEpochChange; while that report is in flight, an
// Update (which finds the term ended) must not return, let alone start the
// next term, so every start is reported after the previous end. The hook is
// held open until Update is seen to wait (or, the defect, to return). The
// test moves the client's clock to the deadline: the calls keep the
// lease's full duration, however slow the machine.
func TestEndReportedBeforeTheLockActs(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	var (
		mu      sync.Mutex
		calls   [][2]lease.Token
		entered = make(chan struct{})
		release = make(chan struct{})
	)
	clk := clocktesting.NewFakeClock(time.Now())
	a := mustLock(t, newClient(t, dsn).WithClock(clk), "k", "a", resourcelock.Config{
		LeaseDuration: time.Minute,
		OnEpochChange: func(old, new lease.Token) {
			mu.Lock()
			calls = append(calls, [2]lease.Token{old, new})
			first := len(calls) == 2
			mu.Unlock()
			if first { // the first end
				close(entered)
				<-release
			}
		}})
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	// The fake clock runs the deadline timer in SetTime, which returns once
	// the hook does.
	stepped := make(chan struct{})
	go func() { clk.SetTime(resourcelock.TermOf(a).Deadline()); close(stepped) }()
	<-entered // the deadline timer is reporting the end (no renewal came)
	updated := make(chan error, 1)
	go func() { updated <- a.Update(ctx, rec("a")) }()
	select {
	case err := <-updated:
		close(release)
		t.Fatalf("Update returned (%v) while the end of the term was still being reported", err)
	case <-time.After(200 * time.Millisecond): // a wait, not a timed assertion
	}
	close(release)
	<-stepped
	if err := <-updated; !apierrors.IsConflict(err) || !errors.Is(err, lease.ErrLocalDeadline) {
		t.Fatalf("Update after the local deadline: %v, want Conflict (ErrLocalDeadline)", err)
	}
	if _, _, err := a.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 || calls[0][1].Epoch != 1 || calls[1][0].Epoch != 1 || calls[1][1] != (lease.Token{}) ||
		calls[2][0] != (lease.Token{}) || calls[2][1].Epoch <= 1 {
		t.Fatalf("OnEpochChange calls %v, want (0,1) (1,0) (0,>1)", calls)
	}
}

// TestTokenContextOfDoneParent: a token context made from a done parent is
// done when TokenContext returns, and its Deadline is the term's.
func TestTokenContextOfDoneParent(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	a := mustLock(t, newClient(t, dsn), "k", "a", resourcelock.Config{LeaseDuration: time.Minute})
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("parent done")
	parent, cancel := context.WithCancelCause(ctx)
	cancel(stop)
	c, cancelC, err := a.TokenContext(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer cancelC()
	if c.Err() == nil || !errors.Is(context.Cause(c), stop) {
		t.Fatalf("token context of a done parent: err %v, cause %v", c.Err(), context.Cause(c))
	}
	live, cancelLive, err := a.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancelLive()
	d, ok := live.Deadline()
	if want := resourcelock.TermOf(a).Deadline(); !ok || !d.Equal(want) {
		t.Fatalf("Deadline %v %v, want the term's %v", d, ok, want)
	}
}

package elector_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestDeadlineAndCheckOnTheInjectedClock: the elector's term deadline and
// its health check run on the client's clock. With a fake clock set to the
// term's deadline the leader context ends (lease.ErrLocalDeadline) at once;
// Check tolerates a callback that has not returned for HealthTolerance past
// the deadline and fails beyond it. No sleeps: only the fake clock moves.
func TestDeadlineAndCheckOnTheInjectedClock(t *testing.T) {
	dsn := installed(t, nil)
	fake := clocktesting.NewFakeClock(time.Now())
	client := lease.New(newPool(t, dsn)).WithClock(fake)
	started := make(chan context.Context, 1)
	release := make(chan struct{})
	el, err := elector.New(client, elector.Config{
		Key: "fake-clock", Identity: "me", TTL: time.Minute, HealthTolerance: 5 * time.Second,
		Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) {
			started <- ctx
			<-release // a callback slow to return
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	defer func() {
		close(release)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	lctx := <-started
	deadline := el.Status().Deadline
	if d, ok := lctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Fatalf("leader context deadline %v %v, want the term's %v", d, ok, deadline)
	}
	if err := el.Check(nil); err != nil {
		t.Fatalf("Check while leading: %v", err)
	}
	fake.SetTime(deadline)
	<-lctx.Done()
	if !errors.Is(context.Cause(lctx), lease.ErrLocalDeadline) {
		t.Fatalf("cause %v, want lease.ErrLocalDeadline", context.Cause(lctx))
	}
	fake.SetTime(deadline.Add(5 * time.Second))
	if err := el.Check(nil); err != nil {
		t.Fatalf("Check within HealthTolerance of the deadline: %v", err)
	}
	fake.SetTime(deadline.Add(5*time.Second + time.Millisecond))
	if err := el.Check(nil); err == nil {
		t.Fatal("Check passed with the callback running past the deadline + HealthTolerance")
	}
}

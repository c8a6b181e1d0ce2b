package elector_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

func noop(context.Context) {}

func TestConfigValidation(t *testing.T) {
	c := lease.New(nil)
	cb := elector.Callbacks{OnStartedLeading: noop}
	for _, tc := range []struct {
		cfg   elector.Config
		field string
	}{
		{elector.Config{Callbacks: cb}, "Key"},
		{elector.Config{Key: "k"}, "Callbacks.OnStartedLeading"},
		{elector.Config{Key: "k", Callbacks: cb, TTL: time.Millisecond}, "TTL"},
		{elector.Config{Key: "k", Callbacks: cb, TTL: 3 * time.Second, RenewInterval: 1001 * time.Millisecond}, "RenewInterval"},
		{elector.Config{Key: "k", Callbacks: cb, RenewInterval: -1}, "RenewInterval"},
		{elector.Config{Key: "k", Callbacks: cb, RenewInterval: time.Second, RetryInterval: 2 * time.Second}, "RetryInterval"},
		{elector.Config{Key: "k", Callbacks: cb, TTL: 10 * time.Second, Margin: 9 * time.Millisecond}, "Margin"},
		{elector.Config{Key: "k", Callbacks: cb, TTL: 3 * time.Second, Margin: 1001 * time.Millisecond}, "Margin"},
		{elector.Config{Key: "k", Callbacks: cb, HealthTolerance: -1}, "HealthTolerance"},
		{elector.Config{Key: strings.Repeat("k", 1025), Callbacks: cb}, "Key"},
		{elector.Config{Key: "k", Callbacks: cb, Candidacy: &handover.Candidacy{Version: "one.two"}}, "Candidacy"},
	} {
		_, err := elector.New(c, tc.cfg)
		if !errors.Is(err, elector.ErrInvalidConfig) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("New(%+v) = %v, want an ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := elector.New(nil, elector.Config{Key: "k", Callbacks: cb}); !errors.Is(err, elector.ErrInvalidConfig) {
		t.Errorf("New(nil client) = %v", err)
	}

	el, err := elector.New(c, elector.Config{Key: "k", Callbacks: cb})
	if err != nil {
		t.Fatal(err)
	}
	got := elector.ConfigOf(el)
	if got.TTL != 15*time.Second || got.RenewInterval != 5*time.Second || got.RetryInterval != 2500*time.Millisecond ||
		got.Margin != 115*time.Millisecond || got.HealthTolerance != 5*time.Second || got.Identity == "" || got.Registerer != nil {
		t.Errorf("defaults: %+v", got)
	}
	el, err = elector.New(c, elector.Config{Key: "k", Callbacks: cb, TTL: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if m := elector.ConfigOf(el).Margin; m != 10*time.Millisecond {
		t.Errorf("Margin for a 30ms TTL = %v, want TTL/3", m)
	}
}

// TestOneLeaderAtATime runs several candidates in one process, each term
// resigning after a random short time, and checks every term: one active
// at a time, epochs strictly increasing and never reused, intervals (local
// monotonic clock) disjoint, fenced writes in the lease database accepted
// for the current term.
func TestOneLeaderAtATime(t *testing.T) {
	dsn := installed(t, nil)
	pool := newPool(t, dsn)
	execSQL(t, pool, "CREATE TABLE writes (epoch bigint, owner text)")
	client := lease.New(pool)
	r := newRecorder()
	// A write cut by its term's end may still have committed: the cancel
	// can come after the server's commit and before its answer. Such a
	// write counts neither way; a write whose commit answered must be there.
	var cutMu sync.Mutex
	cut := map[int64]bool{}
	work := func(ctx context.Context, tr *termRec) {
		tok, ok := lease.TokenFromContext(ctx) // the leader context carries the token
		if !ok || tok != tr.token {
			t.Errorf("leader context carries %v (%v), want %s", tok, ok, tr.token)
		}
		err := fence.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO writes VALUES ($1, $2)", tr.token.Epoch, tr.id)
			return err
		})
		if err != nil {
			// Only the end of the term may stop its write: the test's stop
			// or a lapse can cut a write in flight (nothing commits then).
			if ctx.Err() == nil || !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fenced write of %s in its live term: %v", tr.token, err)
			}
			cutMu.Lock()
			cut[tr.token.Epoch] = true
			cutMu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+rand.IntN(200)) * time.Millisecond):
		}
	}
	const n, wantTerms = 4, 20
	stops := make([]func(), n)
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		var el *elector.Elector
		var err error
		el, err = elector.New(client, elector.Config{
			Key: "one-leader", Identity: id, TTL: 2 * time.Second, RetryInterval: 20 * time.Millisecond,
			Callbacks: r.callbacks(id, &el, work),
		})
		if err != nil {
			t.Fatal(err)
		}
		stops[i] = runElector(t, el)
	}
	// Terms are counted, not timed: a loaded machine runs fewer per second.
	ctx := testCtx(t)
	for started := 0; started < wantTerms; started++ {
		select {
		case <-ctx.Done():
			t.Fatalf("only %d terms began before the test's deadline", started)
		case <-r.events:
		}
	}
	for _, stop := range stops {
		stop()
	}
	terms := r.snapshot()
	if r.maxAct != 1 {
		t.Errorf("%d terms active at once", r.maxAct)
	}
	sort.Slice(terms, func(i, j int) bool { return terms[i].start.Before(terms[j].start) })
	seen := map[int64]bool{}
	for i, tr := range terms {
		if seen[tr.token.Epoch] {
			t.Errorf("epoch %d handed out twice", tr.token.Epoch)
		}
		seen[tr.token.Epoch] = true
		if tr.grant.Epoch != tr.token.Epoch || tr.token.Owner != tr.id || tr.token.Key != "one-leader" {
			t.Errorf("term %d: token %v, grant %v, id %s", i, tr.token, tr.grant.Token, tr.id)
		}
		if i == 0 {
			continue
		}
		prev := terms[i-1]
		if tr.token.Epoch <= prev.token.Epoch {
			t.Errorf("epoch went from %d to %d", prev.token.Epoch, tr.token.Epoch)
		}
		if !prev.returned.Before(tr.start) || !prev.cancelled.Before(tr.start) {
			t.Errorf("term %v started at %v before term %v was cancelled (%v) and returned (%v)",
				tr.token, tr.start, prev.token, prev.cancelled, prev.returned)
		}
		// Handoffs happen by release: the new grant starts (server time)
		// after the previous one was given up and before it would have
		// expired.
		acquired := tr.grant.ExpiresAt.Add(-tr.grant.TTL)
		if !acquired.Before(prev.last.ExpiresAt) {
			t.Errorf("term %v acquired at %v, not before the expiry %v of %v: the release did not hand off",
				tr.token, acquired, prev.last.ExpiresAt, prev.token)
		}
	}
	rows, err := pool.Query(testCtx(t), "SELECT epoch, owner FROM writes")
	if err != nil {
		t.Fatal(err)
	}
	written := map[int64]string{}
	for rows.Next() {
		var epoch int64
		var owner string
		if err := rows.Scan(&epoch, &owner); err != nil {
			t.Fatal(err)
		}
		if _, twice := written[epoch]; twice {
			t.Errorf("epoch %d wrote twice", epoch)
		}
		written[epoch] = owner
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tr := range terms {
		owner, ok := written[tr.token.Epoch]
		switch {
		case ok && owner != tr.id:
			t.Errorf("epoch %d written by %s, its term was %s's", tr.token.Epoch, owner, tr.id)
		case !ok && !cut[tr.token.Epoch]:
			t.Errorf("term %v: its fenced write answered but is not in the table", tr.token)
		}
		delete(written, tr.token.Epoch)
	}
	for epoch := range written {
		t.Errorf("epoch %d wrote, but no term had it", epoch)
	}
	t.Logf("%d terms, epochs %d..%d", len(terms), terms[0].token.Epoch, terms[len(terms)-1].token.Epoch)
}

// TestReleaseOnCancel: cancelling the leader's Run hands the lease to a
// follower without waiting for the TTL; the follower polls (every 50ms) or
// is woken by listen.Waiter's notification (its poll and the TTL then
// outlast the test, so that nothing else can hand it the key in time).
func TestReleaseOnCancel(t *testing.T) {
	t.Run("poll", func(t *testing.T) { testReleaseOnCancel(t, false) })
	t.Run("waiter", func(t *testing.T) { testReleaseOnCancel(t, true) })
}

func testReleaseOnCancel(t *testing.T, useWaiter bool) {
	dsn := installed(t, nil)
	pool := newPool(t, dsn)
	client := lease.New(pool)
	retry, ttl := 50*time.Millisecond, 10*time.Second
	var waiter *listen.Waiter
	if useWaiter {
		w, err := listen.NewWaiter(testCtx(t), pool.Config().ConnConfig, listen.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		waiter = w
		retry, ttl = 15*time.Minute, 50*time.Minute
	}
	r := newRecorder()
	mk := func(id string) *elector.Elector {
		var el *elector.Elector
		var err error
		el, err = elector.New(client, elector.Config{
			Key: "handoff", Identity: id, TTL: ttl, RetryInterval: retry, Waiter: waiter,
			Callbacks: r.callbacks(id, &el, nil),
		})
		if err != nil {
			t.Fatal(err)
		}
		return el
	}
	a, b := mk("a"), mk("b")
	stopA := runElector(t, a)
	ta := waitTerm(t, r.events, time.Minute)
	stopB := runElector(t, b)
	defer stopB()
	// b becomes a follower once it has read the key.
	pgtest.Eventually(t, time.Minute, "b to observe a's term", func() bool { return b.Status().Leader != "" })
	if s := b.Status(); s.Leading || s.Leader != "a" || s.Epoch != ta.token.Epoch {
		t.Fatalf("follower status %+v", s)
	}
	cancelled := time.Now()
	stopA() // returns after a's release
	tb := waitTerm(t, r.events, time.Minute)
	handoff := tb.start.Sub(cancelled)
	ended := <-r.ended
	if tb.id != "b" || ended.id != "a" {
		t.Fatalf("terms: %s then %s", ta.id, tb.id)
	}
	if !errors.Is(ended.cause, lease.ErrReleased) || !errors.Is(ended.cause, context.Canceled) {
		t.Errorf("a's cause: %v", ended.cause)
	}
	if tb.token.Epoch != ta.token.Epoch+2 {
		t.Errorf("epochs %d then %d, want a release in between (+2)", ta.token.Epoch, tb.token.Epoch)
	}
	acquired := tb.grant.ExpiresAt.Add(-tb.grant.TTL)
	if !acquired.Before(ended.last.ExpiresAt) {
		t.Errorf("b acquired at %v, after a's grant expired at %v", acquired, ended.last.ExpiresAt)
	}
	if !ended.returned.Before(tb.start) {
		t.Errorf("b started before a's OnStartedLeading returned")
	}
	if useWaiter && handoff >= retry {
		t.Errorf("handoff took %v with a Waiter: b was not woken by the release (poll interval %v)", handoff, retry)
	}
	t.Logf("handoff after cancel: %v (TTL %v; a's grant had %v left on the server)",
		handoff.Round(time.Millisecond), ttl, ended.last.ExpiresAt.Sub(acquired).Round(time.Millisecond))
}

// TestLostStopsAtOnce: a renewal answered not_owner (an operator's
// force_release) cancels the leader context at once; the same identity
// then campaigns again and gets a new epoch, after the old term ended.
func TestLostStopsAtOnce(t *testing.T) {
	renews := &pgtest.Statements{}
	pool := pgtest.NewPool(t, installed(t, nil), renews.Traced)
	reg := prometheus.NewRegistry()
	r := newRecorder()
	var el *elector.Elector
	el, err := elector.New(lease.New(pool), elector.Config{
		Key: "lost", Identity: "solo", TTL: 3 * time.Second, RetryInterval: 50 * time.Millisecond,
		Registerer: reg, Callbacks: r.callbacks("solo", &el, nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	runElector(t, el)
	t1 := waitTerm(t, r.events, time.Minute)
	pgtest.Eventually(t, time.Minute, "a renewal", func() bool {
		return seriesCount(t, reg, "pg_lease_elector_renew_duration_seconds") > 0
	})
	if v := value(t, elector.LeaderOf(el, "lost")); v != 1 {
		t.Errorf("leader gauge %v", v)
	}
	if v := value(t, elector.EpochOf(el, "lost")); v != float64(t1.token.Epoch) {
		t.Errorf("epoch gauge %v, want %d", v, t1.token.Epoch)
	}
	if n := seriesCount(t, reg, "pg_lease_elector_renew_duration_seconds"); n != 1 {
		t.Errorf("renew histogram series: %d", n)
	}
	forced := time.Now()
	if _, err := pool.Exec(testCtx(t), "SELECT lease.force_release('lost')"); err != nil {
		t.Fatal(err)
	}
	released := time.Now() // every renewal sent from here on is answered not_owner
	ended := waitTerm(t, r.ended, time.Minute)
	if !errors.Is(ended.cause, lease.ErrLost) || !errors.Is(ended.cause, lease.ErrNotOwner) {
		t.Errorf("cause %v, want lease.ErrLost and lease.ErrNotOwner", ended.cause)
	}
	// At once: the first not_owner answer ends the term; the old epoch is
	// never renewed again after one.
	if n := renewsAfter(renews, t1.token.Epoch, released); n > 1 {
		t.Errorf("epoch %d renewed %d times after the force_release committed, want at most once (its answer ends the term)", t1.token.Epoch, n)
	}
	t2 := waitTerm(t, r.events, time.Minute)
	if t2.token.Epoch <= t1.token.Epoch || t2.id != "solo" {
		t.Errorf("second term %v after %v", t2.token, t1.token)
	}
	if !t1.cancelled.Before(t2.start) || !t1.returned.Before(t2.start) {
		t.Errorf("new term started before the old one ended")
	}
	if v := value(t, elector.ErrorsOf(el, "lost", "not_owner")); v != 1 {
		t.Errorf("not_owner errors: %v", v)
	}
	if v := value(t, elector.TransitionsOf(el, "lost", "stopped")); v != 1 {
		t.Errorf("stopped transitions: %v", v)
	}
	if v := value(t, elector.TransitionsOf(el, "lost", "started")); v != 2 {
		t.Errorf("started transitions: %v", v)
	}
	if v := value(t, elector.EpochOf(el, "lost")); v != float64(t2.token.Epoch) {
		t.Errorf("epoch gauge %v, want %d", v, t2.token.Epoch)
	}
	t.Logf("not_owner noticed %v after force_release; new epoch %d",
		ended.cancelled.Sub(forced).Round(time.Millisecond), t2.token.Epoch)
}

// TestLapseThenReacquire: renewals blocked (the lease row locked by another
// session) past the grant: the leader context is cancelled before the
// server's expiry, and the same identity's next term, under a new epoch,
// starts only after the old term's context was cancelled and its callback
// returned. The health check fails while a callback ignores its cancelled
// context past the tolerance.
func TestLapseThenReacquire(t *testing.T) {
	dsn := installed(t, nil)
	pool := newPool(t, dsn)
	r := newRecorder()
	release := make(chan struct{})
	var terms atomic.Int64
	work := func(ctx context.Context, tr *termRec) {
		<-ctx.Done()
		if terms.Add(1) == 1 {
			<-release // the first term ignores its cancellation for a while
		}
	}
	var el *elector.Elector
	var err error
	el, err = elector.New(lease.New(pool), elector.Config{
		Key: "lapse", Identity: "same", TTL: 2 * time.Second, RetryInterval: 50 * time.Millisecond,
		HealthTolerance: 300 * time.Millisecond, Callbacks: r.callbacks("same", &el, work),
	})
	if err != nil {
		t.Fatal(err)
	}
	runElector(t, el)
	t1 := waitTerm(t, r.events, time.Minute)
	// Unhealthy only once the term ended at its deadline (a renewal slower
	// than the 2 s TTL allows) and the callback ignores that.
	if err := el.Check(&http.Request{}); err != nil && el.Status().Leading {
		t.Errorf("healthy leader: %v", err)
	}
	offset, uncert := clockOffset(t, pool)

	// Block renewals: lock the lease row.
	ctx := testCtx(t)
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	var expires time.Time
	if err := locker.QueryRow(ctx, "SELECT expires_at FROM lease.leases WHERE key = 'lapse' FOR UPDATE").Scan(&expires); err != nil {
		t.Fatal(err)
	}
	// Wait for the cancellation, as the callback observes it.
	var cancelled time.Time
	var cause error
	pgtest.Eventually(t, time.Minute, "the leader context cancelled while renewals are blocked", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		cancelled, cause = t1.cancelled, t1.cause
		return !cancelled.IsZero()
	})
	// Cancelled by the deadline timer, not by a later answer: the instant
	// the term set for it is checked against the server's expiry (the
	// callback's observation of it comes a scheduling delay later).
	if !errors.Is(cause, lease.ErrLocalDeadline) {
		t.Errorf("cause %v, want lease.ErrLocalDeadline", cause)
	}
	deadline := el.Status().Deadline
	if deadline.IsZero() || cancelled.Before(deadline) {
		t.Fatalf("term deadline %v, leader context cancelled at %v: want the cancellation at or after the deadline", deadline, cancelled)
	}
	cancelServer := deadline.Add(offset)
	if !cancelServer.Add(uncert).Before(expires) {
		t.Errorf("deadline at server time %v (±%v), not before the grant's expiry %v", cancelServer, uncert, expires)
	}
	t.Logf("leader context cancelled at a deadline %v before the server expiry (margin %v, offset %v ±%v; observed %v after the deadline)",
		expires.Sub(cancelServer).Round(time.Millisecond), elector.ConfigOf(el).Margin, offset, uncert,
		cancelled.Sub(deadline).Round(time.Millisecond))

	// The callback ignores its cancellation: unhealthy after the tolerance.
	time.Sleep(elector.ConfigOf(el).Margin + 400*time.Millisecond)
	if err := el.Check(&http.Request{}); err == nil {
		t.Errorf("Check with a callback running past its deadline: %v", err)
	}
	// Let the lease lapse on the server (its own clock says so), then unblock.
	pgtest.WaitServerPast(t, pool, expires)
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if s := el.Status(); s.Leading {
		t.Errorf("a new term started while the old callback was still running: %+v", s)
	}
	close(release)
	t2 := waitTerm(t, r.events, time.Minute)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t2.token.Epoch != t1.token.Epoch+1 || t2.token.Owner != "same" {
		t.Errorf("after the lapse: %v, want epoch %d", t2.token, t1.token.Epoch+1)
	}
	if !t1.cancelled.Before(t2.start) || !t1.returned.Before(t2.start) {
		t.Errorf("term %v started before term %v ended", t2.token, t1.token)
	}
	if err := el.Check(&http.Request{}); err != nil {
		t.Errorf("Check in the new term: %v", err)
	}
}

// TestMetricsRegistry: several electors on one registry register the
// metrics once and share them, each key its own series.
func TestMetricsRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := lease.New(nil)
	cb := elector.Callbacks{OnStartedLeading: func(context.Context) {}}
	e1, err := elector.New(c, elector.Config{Key: "x", Callbacks: cb, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	e2, err := elector.New(c, elector.Config{Key: "y", Callbacks: cb, Registerer: reg})
	if err != nil {
		t.Fatalf("second elector on one registry: %v", err)
	}
	elector.LeaderOf(e1, "x").Set(1)
	if v := value(t, elector.LeaderOf(e2, "x")); v != 1 {
		t.Errorf("the second elector on one registry does not share the first's metrics: %v", v)
	}
	elector.LeaderOf(e2, "y").Set(1)
	if n := seriesCount(t, reg, "pg_lease_elector_leader"); n != 2 {
		t.Errorf("leader gauge series on the registry: %d, want 2 (x and y)", n)
	}
}

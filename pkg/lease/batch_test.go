package lease_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestRenewMany: one batch answers each token as Renew would, in order,
// renews the held ones to one server expiry, and refuses bad batches.
func TestRenewMany(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	c := db.c
	var held []lease.Token
	for _, k := range []string{"b-3", "b-1", "b-2"} {
		g, ok, err := c.Acquire(ctx, k, "o1", 30*time.Second)
		if err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", k, ok, err)
		}
		held = append(held, g.Token)
	}
	other, _, err := c.Acquire(ctx, "b-other", "o2", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	free, _, err := c.Acquire(ctx, "b-free", "o1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, free.Token); err != nil {
		t.Fatal(err)
	}
	ts := append(append([]lease.Token{}, held...),
		lease.Token{Key: "b-other", Owner: "o1", Epoch: other.Epoch},
		lease.Token{Key: "b-never", Owner: "o1", Epoch: 1},
		lease.Token{Key: "b-free", Owner: "o1", Epoch: 1})
	wrongEpoch := held[0]
	wrongEpoch.Epoch++

	// The server's clock read around the call bounds its duration on the
	// server: the renewed expiry is at least s0 + TTL, read by the client at
	// most at s1, so ValidUntil is at least before + TTL - (s1 - s0).
	serverClock := func() time.Time {
		t.Helper()
		var at time.Time
		if err := db.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := time.Now()
	s0 := serverClock()
	res, err := c.RenewMany(ctx, ts, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	took := serverClock().Sub(s0)
	if len(res) != len(ts) {
		t.Fatalf("%d results for %d tokens", len(res), len(ts))
	}
	for i, r := range res {
		if r.Token != ts[i] {
			t.Errorf("result %d is for %v, want %v (input order)", i, r.Token, ts[i])
		}
	}
	for i := range held {
		r := res[i]
		if r.Err != nil {
			t.Fatalf("%v: %v", r.Token, r.Err)
		}
		if r.Grant.Token != held[i] || r.Grant.TTL != time.Minute {
			t.Errorf("%v: grant %v ttl %v", r.Token, r.Grant.Token, r.Grant.TTL)
		}
		if !r.Grant.ExpiresAt.Equal(res[0].Grant.ExpiresAt) {
			t.Errorf("%v: expiry %v, the batch's first %v (one expiry per batch)", r.Token, r.Grant.ExpiresAt, res[0].Grant.ExpiresAt)
		}
		if r.Grant.ValidUntil().Before(before.Add(time.Minute - took)) {
			t.Errorf("%v: valid until %v, renewed for a minute at %v in %v of server time", r.Token, r.Grant.ValidUntil(), before, took)
		}
	}
	for _, r := range res[len(held):] {
		if !errors.Is(r.Err, lease.ErrNotOwner) || !errors.Is(r.Err, lease.ErrLost) {
			t.Errorf("%v: %v, want not_owner", r.Token, r.Err)
		}
	}
	// The server's expiry moved for the held keys.
	st, err := c.Inspect(ctx, "b-2")
	if err != nil {
		t.Fatal(err)
	}
	if !st.ExpiresAt.Equal(res[0].Grant.ExpiresAt) {
		t.Errorf("b-2 expires at %v on the server, the batch said %v", st.ExpiresAt, res[0].Grant.ExpiresAt)
	}
	// A wrong epoch beside a good one.
	res, err = c.RenewMany(ctx, []lease.Token{held[1], wrongEpoch}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || !errors.Is(res[1].Err, lease.ErrEpochMismatch) {
		t.Errorf("good %v, wrong epoch %v", res[0].Err, res[1].Err)
	}

	// Nothing to renew: no call, no error.
	if res, err := c.RenewMany(ctx, nil, time.Minute); res != nil || err != nil {
		t.Errorf("empty batch: %v %v", res, err)
	}
	// Bad batches: refused as invalid input, changing nothing.
	many := make([]lease.Token, lease.MaxBatch+1)
	for i := range many {
		many[i] = lease.Token{Key: fmt.Sprintf("m-%d", i), Owner: "o1", Epoch: 1}
	}
	bad := map[string][]lease.Token{
		"two owners":   {held[0], {Key: "b-x", Owner: "o2", Epoch: 1}},
		"repeated key": {held[0], held[0]},
		"too many":     many,
		"empty key":    {held[0], {Key: "", Owner: "o1", Epoch: 1}},
		"epoch 0":      {held[0], {Key: "b-y", Owner: "o1", Epoch: 0}},
	}
	for name, b := range bad {
		if _, err := c.RenewMany(ctx, b, time.Minute); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("%s: %v, want ErrInvalidInput", name, err)
		}
	}
	if _, err := c.RenewMany(ctx, held, 0); !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("ttl 0: %v, want ErrInvalidInput", err)
	}
	if _, err := c.RenewMany(ctx, held, 2*time.Hour); !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("ttl above max_ttl: %v, want ErrInvalidInput", err)
	}
}

// TestRenewTerms: a batch renewal moves each live term's deadline, ends the
// term whose grant the server says is gone, and leaves ended terms out.
func TestRenewTerms(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	c := db.c
	var terms []*lease.Term
	for _, k := range []string{"t-a", "t-b", "t-c"} {
		g, ok, err := c.Acquire(ctx, k, "o1", 30*time.Second)
		if err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", k, ok, err)
		}
		term, err := c.Begin(g, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = term.Release(ctx) })
		terms = append(terms, term)
	}
	// t-b is taken from its holder; t-c's term ends locally.
	if released, _, _, err := leaseadmin.ForceRelease(ctx, c, "t-b"); err != nil || !released {
		t.Fatalf("force_release: %v %v", released, err)
	}
	terms[2].End(lease.ErrReleased)
	old := terms[0].Deadline()

	errs := c.RenewTerms(ctx, terms)
	if errs[0] != nil {
		t.Fatalf("t-a: %v", errs[0])
	}
	if !terms[0].Deadline().After(old) {
		t.Errorf("t-a: deadline %v not after %v", terms[0].Deadline(), old)
	}
	if !errors.Is(errs[1], lease.ErrNotOwner) || !errors.Is(terms[1].Err(), lease.ErrNotOwner) {
		t.Errorf("t-b: %v, term %v; want not_owner for both", errs[1], terms[1].Err())
	}
	select {
	case <-terms[1].Done():
	default:
		t.Error("t-b: term not done after the server said the grant is gone")
	}
	if !errors.Is(errs[2], lease.ErrReleased) {
		t.Errorf("t-c: %v, want the term's end (ErrReleased)", errs[2])
	}
	if errs := c.RenewTerms(ctx, []*lease.Term{terms[0], terms[0]}); !errors.Is(errs[0], lease.ErrInvalidInput) {
		t.Errorf("a term twice: %v", errs[0])
	}
}

// ReleaseMany releases each grant as Release would, in one statement: the
// current grants are freed (their counters move past their epochs), a
// stale token gets ErrLost, and a repeated key is invalid input.
func TestReleaseMany(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		var ts []lease.Token
		for _, k := range []string{"r2", "r1", "r3"} {
			g, ok, err := c.Acquire(ctx, k, "o", time.Minute)
			if err != nil || !ok {
				t.Fatalf("acquire %s: %v %v", k, ok, err)
			}
			ts = append(ts, g.Token)
		}
		stale := ts[2]
		stale.Epoch++
		errs, err := c.ReleaseMany(ctx, []lease.Token{ts[0], ts[1], stale})
		if err != nil {
			t.Fatal(err)
		}
		if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], lease.ErrLost) {
			t.Errorf("ReleaseMany: %v", errs)
		}
		for i, tok := range ts {
			st, err := c.Inspect(ctx, tok.Key)
			if err != nil {
				t.Fatal(err)
			}
			if want := i == 2; st.Held != want {
				t.Errorf("%s held %v after ReleaseMany, want %v", tok.Key, st.Held, want)
			}
		}
		if _, err := c.ReleaseMany(ctx, []lease.Token{ts[2], ts[2]}); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("a repeated key: %v, want ErrInvalidInput", err)
		}
	})
}

// AcquireMany takes free keys, answers the owner's own grants again, and
// leaves keys held by another owner, in one statement; results follow the
// order of the keys given.
func TestAcquireMany(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		mine, ok, err := c.Acquire(ctx, "a2", "o", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, ok, err := c.Acquire(ctx, "a3", "other", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
		grants, denied, err := c.AcquireMany(ctx, []string{"a3", "a1", "a2"}, "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(grants) != 3 || len(denied) != 3 {
			t.Fatalf("%d grants and %d errors for 3 keys", len(grants), len(denied))
		}
		for i, e := range denied {
			if e != nil {
				t.Errorf("key %d: %v, want no error outside a grace", i, e)
			}
		}
		if grants[0] != (lease.Grant{}) {
			t.Errorf("a3, held by another: %+v, want the zero Grant", grants[0])
		}
		if grants[1].Key != "a1" || grants[1].Owner != "o" || grants[1].Epoch == 0 {
			t.Errorf("a1, free: %+v", grants[1])
		}
		if grants[2].Token != mine.Token {
			t.Errorf("a2, the owner's own: %+v, want %v", grants[2], mine.Token)
		}
		if err := c.Release(ctx, grants[1].Token); err != nil {
			t.Errorf("release of AcquireMany's grant: %v", err)
		}
		if _, _, err := c.AcquireMany(ctx, []string{"a1", "a1"}, "o", time.Minute); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("a repeated key: %v, want ErrInvalidInput", err)
		}
	})
}

// TestRenewTokens: a grant held without a term (as a handover gives one) is
// renewed by its token and comes back as a grant to begin a term with; a
// token of another owner or epoch is refused, and nothing is granted.
func TestRenewTokens(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	c := db.c
	g, ok, err := c.Acquire(ctx, "t-1", "o1", 30*time.Second)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	ts := []lease.Token{g.Token, {Key: "t-1x", Owner: "o1", Epoch: 1}, {Key: "t-2", Owner: "o1", Epoch: 1}}
	if _, ok, err := c.Acquire(ctx, "t-2", "o2", 30*time.Second); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	grants, errs, err := c.RenewTokens(ctx, ts, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || grants[0].Token != g.Token || grants[0].TTL != time.Minute || !grants[0].ExpiresAt.After(g.ExpiresAt) {
		t.Errorf("own grant: %v %v", grants[0], errs[0])
	}
	term, err := c.Begin(grants[0], 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	term.End(lease.ErrReleased)
	for i := 1; i < len(ts); i++ {
		if !errors.Is(errs[i], lease.ErrLost) || grants[i].Epoch != 0 {
			t.Errorf("%v: %v %v, want lost and no grant", ts[i], grants[i], errs[i])
		}
	}
	if st, err := c.Inspect(ctx, "t-1x"); err != nil || st.Held {
		t.Errorf("t-1x: %+v %v, want never granted", st, err)
	}
}

// TestAcquireManyAt: asked at a holder's expiry, the statement is seen
// waiting on the server (pg_sleep) while the key is still held, and takes
// the key once it lapsed; asked at an instant further off than its ttl,
// it waits a ttl at most and finds the key still held.
func TestAcquireManyAt(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	c := db.c
	// The holder's grant must outlast the observation of the waiting
	// statement: redone twice as long when it lapsed first.
	for hold, round := 2*time.Second, 0; ; hold, round = hold*2, round+1 {
		key := fmt.Sprintf("at-%d", round)
		held, ok, err := c.Acquire(ctx, key, "x", hold)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		type result struct {
			grants []lease.Grant
			errs   []error
			err    error
		}
		done := make(chan result, 1)
		go func() {
			g, e, err := c.AcquireManyAt(ctx, held.ExpiresAt, []string{key}, "o", time.Minute)
			done <- result{g, e, err}
		}()
		var waiting bool
		for !waiting {
			if err := db.pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
WHERE datname = current_database() AND wait_event = 'PgSleep' AND query LIKE '%lease.acquire(%'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if !waiting {
				select {
				case r := <-done:
					t.Fatalf("AcquireManyAt returned before it was seen waiting: %+v", r)
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
		st, err := c.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		r := <-done
		if !st.Held || st.Epoch != held.Epoch {
			t.Logf("the %v grant lapsed before the waiting statement was seen; again with %v", hold, 2*hold)
			continue
		}
		if r.err != nil || r.errs[0] != nil {
			t.Fatal(r.err, r.errs)
		}
		if g := r.grants[0]; g.Owner != "o" || g.Epoch <= held.Epoch {
			t.Fatalf("asked at the holder's expiry: %+v, want o's grant after epoch %d", g, held.Epoch)
		}
		break
	}

	// The wait is bounded by the ttl asked for.
	if _, ok, err := c.Acquire(ctx, "at-far", "x", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	grants, denied, err := c.AcquireManyAt(ctx, time.Now().Add(time.Hour), []string{"at-far"}, "o", time.Second)
	if err != nil || denied[0] != nil || grants[0] != (lease.Grant{}) {
		t.Fatalf("asked an hour ahead with a 1s ttl: %+v %v %v, want denied after the ttl's wait", grants, denied, err)
	}
}

// TestAcquireManyAtGrantCountsTheWait: a grant taken after the server's
// wait is valid, on the local clock, for about its ttl from the end of the
// wait, not from the send: the server's clock read before the wait bounds
// the send, and the grant expires a ttl after the wait ended.
func TestAcquireManyAtGrantCountsTheWait(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	var s0 time.Time
	before := time.Now()
	if err := db.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&s0); err != nil {
		t.Fatal(err)
	}
	const wait, ttl = 2 * time.Second, 5 * time.Second
	grants, denied, err := db.c.AcquireManyAt(ctx, s0.Add(wait), []string{"after-wait"}, "o", ttl)
	if err != nil || denied[0] != nil || grants[0].Epoch == 0 {
		t.Fatal(grants, denied, err)
	}
	g := grants[0]
	if g.ExpiresAt.Before(s0.Add(wait + ttl)) {
		t.Fatalf("granted until %v, before the asked instant plus the ttl %v", g.ExpiresAt, s0.Add(wait+ttl))
	}
	// Valid until at least before + wait + ttl, less the time from the
	// read of s0 to the statement's start (far below half the wait).
	if min := before.Add(wait/2 + ttl); g.ValidUntil().Before(min) {
		t.Errorf("valid until %v after the call began, want at least %v: the wait was counted against the grant",
			g.ValidUntil().Sub(before), min.Sub(before))
	}
	// Never later than the server's expiry: the server's clock read after
	// the call bounds it from above.
	var s1 time.Time
	if err := db.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&s1); err != nil {
		t.Fatal(err)
	}
	if late := time.Now().Add(g.ExpiresAt.Sub(s1)); g.ValidUntil().After(late) {
		t.Errorf("valid until %v, later than the server's expiry (by %v at the latest)", g.ValidUntil(), late)
	}
}

// TestAcquireManyAtNeedsReadCommitted: a wait under REPEATABLE READ would
// act, after it, on the snapshot taken before it (every change of a key
// during the wait fails the whole batch with 40001): asked at a later
// instant in such a transaction, AcquireManyAt is refused with
// ErrInvalidIsolation before waiting, as AcquireWait is, and takes
// nothing. Asked at once, it runs.
func TestAcquireManyAtNeedsReadCommitted(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		asked := time.Now()
		_, _, err = lease.New(tx).AcquireManyAt(ctx, asked.Add(3*time.Second), []string{"rr-free", "rr-other"}, "o", 3*time.Second)
		_ = tx.Rollback(ctx)
		var pgErr *pgconn.PgError
		if !errors.Is(err, lease.ErrInvalidIsolation) || !errors.As(err, &pgErr) || !strings.Contains(pgErr.Detail, "READ COMMITTED") {
			t.Errorf("%s: %v after %v, want ErrInvalidIsolation before any wait", iso, err, time.Since(asked))
		}
		tx, err = db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		grants, denied, err := lease.New(tx).AcquireManyAt(ctx, time.Time{}, []string{"rr-now"}, "o", time.Minute)
		_ = tx.Rollback(ctx)
		if err != nil || denied[0] != nil || grants[0].Epoch == 0 {
			t.Errorf("%s, asked at once: %v %v %v, want a grant", iso, grants, denied, err)
		}
	}
	for _, k := range []string{"rr-free", "rr-other", "rr-now"} {
		if st, err := db.c.Inspect(ctx, k); err != nil || st.Held {
			t.Errorf("%s: %+v %v, want nothing taken", k, st, err)
		}
	}
}

// TestAcquireManyAtRefusesAnInstantItCannotSend: an instant outside
// PostgreSQL's timestamptz range, or beyond what the binary encoding's
// microseconds hold (it would wrap to another instant, maybe a past one:
// no wait at all), is refused before a round trip as invalid input, and
// nothing is taken. The first and the far instants that can be sent run.
func TestAcquireManyAtRefusesAnInstantItCannotSend(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	for _, at := range []time.Time{
		time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-4713, time.November, 23, 23, 59, 59, 0, time.UTC),
		time.Date(294248, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(586000, 1, 1, 0, 0, 0, 0, time.UTC), // wraps to about 2000
	} {
		_, _, err := db.c.AcquireManyAt(ctx, at, []string{"far"}, "o", time.Second)
		var pgErr *pgconn.PgError
		if !errors.Is(err, lease.ErrInvalidInput) || errors.As(err, &pgErr) {
			t.Errorf("at %v: %v, want a client-side ErrInvalidInput", at, err)
		}
	}
	if st, err := db.c.Inspect(ctx, "far"); err != nil || st.Exists {
		t.Errorf("far: %+v %v, want never leased", st, err)
	}
	for _, at := range []time.Time{
		time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC),
		time.Date(294240, 1, 1, 0, 0, 0, 0, time.UTC), // a ttl's wait
	} {
		grants, denied, err := db.c.AcquireManyAt(ctx, at, []string{"near"}, "o", 200*time.Millisecond)
		if err != nil || denied[0] != nil || grants[0].Epoch == 0 {
			t.Errorf("at %v: %v %v %v, want a grant", at, grants, denied, err)
		}
	}
}

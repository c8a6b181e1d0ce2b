package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
)

// The promotion path on one server. A promotion is simulated as the SQL sees
// one: the recorded timeline (lease.timeline_state) differs from the
// server's, and the rows were written under another postmaster (the old
// primary's). Real promotions are in test/failover.

// oldPrimaryRows moves every row to an earlier server life.
const oldPrimaryRows = "UPDATE lease.leases SET life = life - interval '1 day'"

func simulatePromotion(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// The older timeline recorded, the rows written by the old primary's
	// postmaster, and a checkpoint on the server's: a promotion requests one
	// at once, and the grace runs from it.
	for _, q := range []string{"UPDATE lease.timeline_state SET timeline = 0", oldPrimaryRows, "CHECKPOINT"} {
		if _, err := pool.Exec(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
}

func configure(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(testCtx(t), "SELECT lease.configure("+sql+")"); err != nil {
		t.Fatal(err)
	}
}

// waitBackend waits until some backend running a query matching like is in
// the wait event (or wait event type) named.
func waitBackend(t *testing.T, pool *pgxpool.Pool, like, wait string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
		    WHERE query LIKE $1 AND (wait_event = $2 OR wait_event_type = $2) AND pid <> pg_backend_pid()`,
			like, wait).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend running %s in %s after a minute", like, wait)
		}
	}
}

// TestMaxTTLEnforcedWhenGranted: a blocking acquire checked against max_ttl
// at its start, then waiting while lease.configure lowered it, is refused at
// grant time (before 0.4.0 it was granted its old ttl after the old value's
// window had passed: a grant no promotion grace covered).
func TestMaxTTLEnforcedWhenGranted(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	// The holder's grant outlasts any delay of this test; its release, after
	// max_ttl is lowered, lets the waiter's grant be decided.
	held, ok, err := db.c.Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := db.c.AcquireWait(ctx, "k", "waiter", 4*time.Second, time.Minute)
		res <- err
	}()
	waitBackend(t, db.pool, "%lease.acquire%", "PgSleep")
	configure(t, db.pool, "max_ttl => '1s'")
	if err := db.c.Release(ctx, held.Token); err != nil {
		t.Fatal(err)
	}
	err = <-res
	if !errors.Is(err, lease.ErrInvalidInput) {
		t.Fatalf("blocking acquire of 4s after max_ttl was lowered to 1s: %v, want ErrInvalidInput", err)
	}
	if s, err := db.c.Inspect(ctx, "k"); err != nil || (s.Held && s.Owner == "waiter") {
		t.Fatalf("inspect: %+v %v: the refused acquire must change nothing", s, err)
	}
}

// TestMaxTTLEnforcedWhenRenewed: a renew checked at its start, then waiting
// for the row lock (a fence held by a transaction) while lease.configure
// lowered max_ttl, is refused once it has the lock.
func TestMaxTTLEnforcedWhenRenewed(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	// The grant outlasts the test's context: the renew finds it held
	// however long the steps take.
	g, ok, err := db.c.Acquire(ctx, "k", "holder", time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := lease.Fence(ctx, tx, g.Token); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := db.c.Renew(ctx, g.Token, 10*time.Second)
		res <- err
	}()
	waitBackend(t, db.pool, "%lease.renew%", "Lock")
	configure(t, db.pool, "max_ttl => '5s'")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-res; !errors.Is(err, lease.ErrInvalidInput) {
		t.Fatalf("renew of 10s that waited while max_ttl was lowered to 5s: %v, want ErrInvalidInput", err)
	}
}

// TestGraceDenialSaysWhenItEnds: during the grace after a promotion an
// acquire is denied with the grace's end (ErrGrace, the server's
// grace_until), WaitOutGrace sleeps until it, and the next acquire is
// granted in the new era. In promotion mode 'synchronous' there is no grace.
func TestGraceDenialSaysWhenItEnds(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	// A call answered after the grace ended proves nothing about the grace:
	// the promotion is simulated again with a grace twice as long until the
	// denials all come back inside one. A grant whose server time is inside
	// the grace fails the test.
	var (
		err   error
		until time.Time
		era   int64
	)
	for grace := 2 * time.Second; ; grace *= 2 {
		configure(t, db.pool, fmt.Sprintf("max_ttl => '%d ms'", grace.Milliseconds()))
		simulatePromotion(t, db.pool)
		grantedInGrace := func(what string, g lease.Grant) bool {
			t.Helper()
			if at := g.ExpiresAt.Add(-g.TTL); at.Before(until) {
				t.Fatalf("%s granted at %v, inside the grace that ends at %v", what, at, until)
			}
			t.Logf("%s answered after the grace of %v ended; again with a longer one", what, grace)
			return true
		}
		var g lease.Grant
		var ok bool
		g, ok, err = db.c.Acquire(ctx, "k", "a", time.Second)
		// The first call after the promotion records it: the grace and era
		// (no grace_until once the grace has ended).
		var u *time.Time
		if err := db.pool.QueryRow(ctx, "SELECT grace_until, era FROM lease.status()").Scan(&u, &era); err != nil {
			t.Fatal(err)
		}
		until = time.Time{}
		if u != nil {
			until = *u
		}
		if ok {
			if grantedInGrace("acquire", g) {
				if err := db.c.Release(ctx, g.Token); err != nil {
					t.Fatal(err)
				}
				continue
			}
		}
		var ge *lease.GraceError
		if !errors.As(err, &ge) {
			t.Fatalf("acquire during the grace: err=%v, want a GraceError", err)
		}
		if !ge.Until.Equal(until) || ge.Key != "k" {
			t.Fatalf("GraceError %+v, want key k until the recorded grace_until %v", ge, until)
		}
		grants, denied, merr := db.c.AcquireMany(ctx, []string{"k", "k2"}, "a", time.Second)
		if merr != nil || len(denied) != 2 {
			t.Fatalf("AcquireMany during the grace: %v", merr)
		}
		late := false
		for i, e := range denied {
			if e == nil && grants[i] != (lease.Grant{}) && grantedInGrace("AcquireMany", grants[i]) {
				if err := db.c.Release(ctx, grants[i].Token); err != nil {
					t.Fatal(err)
				}
				late = true
				continue
			}
			var me *lease.GraceError
			if !errors.As(e, &me) || !me.Until.Equal(until) || grants[i] != (lease.Grant{}) {
				t.Fatalf("AcquireMany during the grace, key %d: %+v, %v; want no grant and a GraceError until %v", i, grants[i], e, until)
			}
		}
		if !late {
			break
		}
	}
	if !listen.WaitOutGrace(ctx, db.c, err) {
		t.Fatal("WaitOutGrace did not recognize the GraceError")
	}
	var past bool
	if err := db.pool.QueryRow(ctx, "SELECT clock_timestamp() >= $1", until).Scan(&past); err != nil || !past {
		t.Fatalf("after WaitOutGrace the server's clock is not past grace_until (%v)", err)
	}
	g, ok, err := db.c.Acquire(ctx, "k", "a", time.Second)
	if err != nil || !ok || g.Epoch>>40 != era {
		t.Fatalf("acquire after the grace: %+v ok=%t err=%v, want a grant of era %d", g, ok, err, era)
	}

	// Switched with no grant held: nothing acknowledged before the switch is
	// believed, so the grace is 0 at once.
	if err := db.c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	configure(t, db.pool, "promotion => 'synchronous'")
	simulatePromotion(t, db.pool)
	g, ok, err = db.c.Acquire(ctx, "k2", "a", time.Second)
	if err != nil || !ok || g.Epoch>>40 != era+1 {
		t.Fatalf("acquire right after a promotion in mode synchronous: %+v ok=%t err=%v, want a grant of era %d at once", g, ok, err, era+1)
	}
}

// TestRenewalRecordsPromotion: after a switchover in which the holder keeps
// renewing, the grace starts at its first renewal (before 0.4.0 only a grant
// path recorded the change, possibly days later, and blocked every key then).
func TestRenewalRecordsPromotion(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	// A minute: the grant and the grace outlast the checkpoint of the
	// simulated promotion on a busy machine.
	configure(t, db.pool, "max_ttl => '1 min'")
	g, ok, err := db.c.Acquire(ctx, "k", "a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	simulatePromotion(t, db.pool)
	if _, err := db.c.Renew(ctx, g.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	var recorded, inGrace bool
	if err := db.pool.QueryRow(ctx, `SELECT timeline = lease._timeline(), coalesce(grace_until > clock_timestamp(), false)
	    FROM lease.status()`).Scan(&recorded, &inGrace); err != nil {
		t.Fatal(err)
	}
	if !recorded || !inGrace {
		t.Fatalf("after the renewal: timeline recorded %t, grace running %t; want both", recorded, inGrace)
	}
}

// TestTimelineRecordingBlocksNoOne: the first grant path after a promotion,
// left in an open transaction, does not delay another key's acquire (before
// 0.4.0 it updated the one timeline row and held its lock until the
// transaction ended: every other grant path waited).
func TestTimelineRecordingBlocksNoOne(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	configure(t, db.pool, "max_ttl => '1 hour'")
	simulatePromotion(t, db.pool)
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, _, err := lease.New(tx).Acquire(ctx, "x", "a", time.Second); !errors.Is(err, lease.ErrGrace) {
		t.Fatalf("first grant path in the open transaction: %v, want ErrGrace", err)
	}
	// Bounded so that a blocked call fails the test rather than hangs it.
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, _, err := db.c.Acquire(bctx, "y", "b", time.Second); !errors.Is(err, lease.ErrGrace) {
		t.Fatalf("another key's acquire while the recording transaction is open: %v, want ErrGrace at once", err)
	}
}

// TestLoweringMaxTTLOnQuietDatabase: on a database where no grant is held
// (a fresh install) a lower max_ttl is the promotion grace at once; nothing
// was granted under the default, so nothing keeps its hour. With a grant
// held, the previous max_ttl stays the grace for its length: that grant may
// still be believed after a promotion.
func TestLoweringMaxTTLOnQuietDatabase(t *testing.T) {
	db := newDB(t, installModes[1])
	ctx := testCtx(t)
	// The grant and the grace it keeps outlast the test's context: neither
	// can end between the steps however long they take.
	const long = 50 * time.Minute
	configure(t, db.pool, "max_ttl => '50 min'")
	s, err := leaseadmin.ReadSettings(ctx, db.c)
	if err != nil || s.MaxTTL != long || s.PromotionGrace != long {
		t.Fatalf("fresh database, max_ttl lowered to 50m: %+v %v, want a grace of 50m", s, err)
	}
	if _, ok, err := db.c.Acquire(ctx, "k", "a", long); err != nil || !ok {
		t.Fatal(ok, err)
	}
	configure(t, db.pool, "max_ttl => '2s'")
	if s, err = leaseadmin.ReadSettings(ctx, db.c); err != nil || s.MaxTTL != 2*time.Second || s.PromotionGrace != long {
		t.Fatalf("max_ttl lowered to 2s with a 50m grant held: %+v %v, want the grace to stay 50m", s, err)
	}
}

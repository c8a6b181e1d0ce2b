package failure

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TTL shorter than the operation's latency (50 ms TTL, 200 ms of work): the
// holder's grant lapses mid-work, another owner takes over during the work
// at a higher epoch, the holder's renew, release and fence say lapsed, and
// the two grants do not overlap in server time.
func TestTTLShorterThanWork(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := pgtest.Context(t, time.Minute)
	a, b := e.client(t), e.client(t)
	admin := e.connect(t)
	const ttl, work = 50 * time.Millisecond, 200 * time.Millisecond

	ga := mustAcquire(t, a, "job", "a", ttl)
	workStart := time.Now()
	rowA, _ := rawRow(t, admin, "job")
	type res struct {
		g   lease.Grant
		err error
		at  time.Time
	}
	bDone := make(chan res, 1)
	go func() { // the other owner waits on the server for the key (the wait only bounds a hang)
		g, err := b.AcquireWait(ctx, "job", "b", time.Minute, 45*time.Second)
		bDone <- res{g, err, time.Now()}
	}()
	// a's work lasts at least 200 ms and until b has taken over: a's calls
	// below come after its work, with the key another owner's.
	rb := <-bDone
	if rb.err != nil {
		t.Fatalf("b's blocking acquire: %v", rb.err)
	}
	time.Sleep(time.Until(workStart.Add(work)))
	if rb.g.Epoch <= ga.Epoch {
		t.Errorf("b's epoch %d is not above a's %d", rb.g.Epoch, ga.Epoch)
	}

	if _, err := a.Renew(ctx, ga.Token, ttl); !errors.Is(err, lease.ErrLapsed) {
		t.Errorf("a's renew after its work: %v, want lapsed", err)
	}
	if err := a.Release(ctx, ga.Token); !errors.Is(err, lease.ErrLapsed) {
		t.Errorf("a's release after its work: %v, want lapsed", err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Fence(ctx, tx, ga.Token); !errors.Is(err, lease.ErrLapsed) {
		t.Errorf("fence under a's epoch: %v, want lapsed", err)
	}
	_ = tx.Rollback(ctx)

	// No overlap in server time: b's grant began at or after a's expiry.
	rowB, _ := rawRow(t, admin, "job")
	if rowB.AcquiredAt.Before(rowA.ExpiresAt) {
		t.Errorf("grants overlap in server time: a's [%s, %s), b's from %s",
			rowA.AcquiredAt.Format(time.RFC3339Nano), rowA.ExpiresAt.Format(time.RFC3339Nano), rowB.AcquiredAt.Format(time.RFC3339Nano))
	}
	// A client that trusts its grant only until ValidUntil (send time plus
	// the time the server said was left) stopped believing before b began
	// (same host clock for both).
	if ga.ValidUntil().Round(0).After(rowB.AcquiredAt) {
		t.Errorf("a's ValidUntil %s is after b's grant began at %s",
			ga.ValidUntil().Round(0).Format(time.RFC3339Nano), rowB.AcquiredAt.Format(time.RFC3339Nano))
	}
	t.Logf("a: [%s, %s) epoch %d, ValidUntil %s; b from %s epoch %d (gap %v, b waited %v)",
		rowA.AcquiredAt.Format("15:04:05.000000"), rowA.ExpiresAt.Format("15:04:05.000000"), ga.Epoch,
		ga.ValidUntil().Round(0).Format("15:04:05.000000"), rowB.AcquiredAt.Format("15:04:05.000000"), rb.g.Epoch,
		rowB.AcquiredAt.Sub(rowA.ExpiresAt), rb.at.Sub(workStart).Round(time.Millisecond))
}

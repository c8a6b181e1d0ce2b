package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// syncServer is a server of the test's own with pg_lease installed and
// synchronous_standby_names naming a standby that never connects: every
// commit that changes a lease waits for it until the wait is cancelled.
type syncServer struct {
	s    *pgtest.Server
	db   *testDB
	pool *pgxpool.Pool // ObserveCommits on its connections
	c    *lease.Client
	// mode: what the interrupter does to a backend waiting for
	// synchronous replication ("cancel" or "terminate"; "" nothing).
	mode       atomic.Value
	interrupts atomic.Int64
}

func newSyncServer(t *testing.T) *syncServer {
	t.Helper()
	s := pgtest.New(t)
	db := newDBOn(t, s, installModes[1]) // the embedded SQL of this build
	pool := pgtest.NewPool(t, db.dsn, func(c *pgxpool.Config) { lease.ObserveCommits(&c.ConnConfig.Config) })
	ss := &syncServer{s: s, db: db, pool: pool, c: lease.New(pool)}
	ss.mode.Store("")
	return ss
}

// startWaiting names the absent standby and starts the interrupter, which
// cancels or terminates (mode) every backend of the test's database found
// waiting for synchronous replication, until the test ends.
func (ss *syncServer) startWaiting(t *testing.T) {
	t.Helper()
	ctx := testCtx(t)
	if err := ss.s.SetSynchronousStandbyNames(ctx, "absent_standby"); err != nil {
		t.Fatal(err)
	}
	admin := connect(t, ss.s.DSN())
	var dbname string
	if err := ss.pool.QueryRow(ctx, "SELECT current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	ictx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ictx.Err() == nil {
			fn := map[string]string{"cancel": "pg_cancel_backend", "terminate": "pg_terminate_backend"}[ss.mode.Load().(string)]
			if fn != "" {
				var n int64
				err := admin.QueryRow(ictx, `SELECT count(*) FILTER (WHERE `+fn+`(pid))
				  FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = $1`, dbname).Scan(&n)
				if err == nil {
					ss.interrupts.Add(n)
				}
			}
			select {
			case <-ictx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
}

// waitInterrupts waits until the interrupter has counted n interrupted
// waits (its count can lag behind the interrupted call's answer).
func (ss *syncServer) waitInterrupts(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ss.interrupts.Load() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d interrupted waits after a minute, want %d", ss.interrupts.Load(), n)
		}
	}
}

// wantUnknown checks that err reports a commit whose synchronous wait was
// interrupted, for op and token.
func wantUnknown(t *testing.T, what string, err error, op string, tok lease.Token) {
	t.Helper()
	if !errors.Is(err, lease.ErrCommitUnknown) {
		t.Fatalf("%s: got %v, want an error matching ErrCommitUnknown", what, err)
	}
	var cu *lease.CommitUnknownError
	if !errors.As(err, &cu) || cu.Op != op || cu.Token != tok || cu.Notice == nil {
		t.Fatalf("%s: error %#v, want a commitUnknownError of %s %v with the server's warning", what, err, op, tok)
	}
}

// TestCommitWhoseSyncWaitIsCancelledIsNotAcknowledged: with the synchronous
// standby absent, each acquire, renew and release waits at its commit until
// the interrupter cancels the wait; PostgreSQL then reports success with a
// warning, the change is committed on the primary only (inspect shows it),
// and the client reports ErrCommitUnknown, never the result.
func TestCommitWhoseSyncWaitIsCancelledIsNotAcknowledged(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	// Grants to renew and release, made while commits wait for nobody.
	gr, ok, err := ss.c.Acquire(ctx, "renewed", "o", time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	gl, ok, err := ss.c.Acquire(ctx, "released", "o", time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ss.startWaiting(t)
	ss.mode.Store("cancel")

	_, ok, err = ss.c.Acquire(ctx, "acquired", "o", time.Hour)
	wantUnknown(t, "acquire", err, "acquire", lease.Token{Key: "acquired", Owner: "o", Epoch: 1})
	if ok {
		t.Fatal("acquire reported ok with ErrCommitUnknown")
	}
	if s, err := ss.c.Inspect(ctx, "acquired"); err != nil || !s.Held || s.Owner != "o" || s.Epoch != 1 {
		t.Fatalf("inspect after the unknown acquire: %+v %v; want held by o at epoch 1 on the primary (committed locally)", s, err)
	}

	// The owner's retry, the idempotent re-acquire, writes nothing of the
	// lease, but must not confirm a grant the standby never received: its
	// commit waits for the standby too (pg_lease 0.4.0), and is cancelled.
	before := ss.interrupts.Load()
	_, ok, err = ss.c.Acquire(ctx, "acquired", "o", time.Hour)
	wantUnknown(t, "the owner's re-acquire", err, "acquire", lease.Token{Key: "acquired", Owner: "o", Epoch: 1})
	if ok {
		t.Fatal("re-acquire reported ok with ErrCommitUnknown")
	}
	ss.waitInterrupts(t, before+1)

	_, err = ss.c.Renew(ctx, gr.Token, time.Hour)
	wantUnknown(t, "renew", err, "renew", gr.Token)
	if s, err := ss.c.Inspect(ctx, "renewed"); err != nil || !s.ExpiresAt.After(gr.ExpiresAt) {
		t.Fatalf("inspect after the unknown renew: %+v %v; want the expiry moved on the primary", s, err)
	}

	err = ss.c.Release(ctx, gl.Token)
	wantUnknown(t, "release", err, "release", gl.Token)
	if s, err := ss.c.Inspect(ctx, "released"); err != nil || s.Held {
		t.Fatalf("inspect after the unknown release: %+v %v; want free on the primary", s, err)
	}
	ss.waitInterrupts(t, 3)
}

// TestCommitWhoseBackendIsTerminatedIsNotRetried: pg_terminate_backend
// during the wait sends the warning and closes the connection. The client
// must not treat that as a dead connection and send the acquire again: the
// second attempt would be the owner's re-acquire of a grant no standby has.
func TestCommitWhoseBackendIsTerminatedIsNotRetried(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	ss.startWaiting(t)
	ss.mode.Store("terminate")
	_, ok, err := ss.c.Acquire(ctx, "k", "o", time.Hour)
	wantUnknown(t, "acquire", err, "acquire", lease.Token{Key: "k", Owner: "o", Epoch: 1})
	if ok {
		t.Fatal("acquire reported ok with ErrCommitUnknown")
	}
	ss.waitInterrupts(t, 1)
}

// TestCommitOfCallersTransaction: Commit of the caller's own transaction
// reports the cancelled wait of its commit.
func TestCommitOfCallersTransaction(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	ss.startWaiting(t)
	ss.mode.Store("cancel")
	tx, err := ss.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, ok, err := lease.New(tx).Acquire(ctx, "k", "o", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := lease.Commit(ctx, tx); !errors.Is(err, lease.ErrCommitUnknown) {
		t.Fatalf("Commit: %v, want ErrCommitUnknown", err)
	}
}

package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
		t.Errorf("%s: got %v, want an error matching ErrCommitUnknown", what, err)
		return
	}
	var cu *lease.CommitUnknownError
	if !errors.As(err, &cu) || cu.Op != op || cu.Token != tok || cu.Notice == nil {
		t.Errorf("%s: error %#v, want a commitUnknownError of %s %v with the server's warning", what, err, op, tok)
	}
}

// clientKind is one way an application builds the Querier of its Client:
// every one must see a cancelled synchronous wait.
type clientKind struct {
	name string
	db   func(t *testing.T, ss *syncServer) lease.Querier
}

var clientKinds = []clientKind{
	{"pool with ObserveCommits", func(t *testing.T, ss *syncServer) lease.Querier { return ss.pool }},
	{"plain pgxpool.New", func(t *testing.T, ss *syncServer) lease.Querier {
		pool, err := pgxpool.New(testCtx(t), ss.db.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}},
	{"plain pgx.Connect", func(t *testing.T, ss *syncServer) lease.Querier { return connect(t, ss.db.dsn) }},
}

// TestCommitWhoseSyncWaitIsCancelledIsNotAcknowledged: with the synchronous
// standby absent, each acquire, renew and release waits at its commit until
// the interrupter cancels the wait; PostgreSQL then reports success with a
// warning, the change is committed on the primary only (inspect shows it),
// and the client reports ErrCommitUnknown, never the result. So on a pool
// with ObserveCommits, on a plain pgxpool.New pool and on a plain
// connection.
func TestCommitWhoseSyncWaitIsCancelledIsNotAcknowledged(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	type grants struct {
		c                 *lease.Client
		renewed, released lease.Grant
	}
	var all []grants
	// Grants to renew and release, made while commits wait for nobody.
	for _, k := range clientKinds {
		c := lease.New(k.db(t, ss))
		gr, ok, err := c.Acquire(ctx, k.name+"/renewed", "o", time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		gl, ok, err := c.Acquire(ctx, k.name+"/released", "o", time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		all = append(all, grants{c, gr, gl})
	}
	ss.startWaiting(t)
	ss.mode.Store("cancel")

	for i, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			c, gr, gl := all[i].c, all[i].renewed, all[i].released
			key := k.name + "/acquired"
			before := ss.interrupts.Load()
			_, ok, err := c.Acquire(ctx, key, "o", time.Hour)
			wantUnknown(t, "acquire", err, "acquire", lease.Token{Key: key, Owner: "o", Epoch: 1})
			if ok {
				t.Error("acquire reported ok")
			}
			if s, err := ss.c.Inspect(ctx, key); err != nil || !s.Held || s.Owner != "o" || s.Epoch != 1 {
				t.Fatalf("inspect after the unknown acquire: %+v %v; want held by o at epoch 1 on the primary (committed locally)", s, err)
			}
			ss.waitInterrupts(t, before+1)

			// The owner's retry, the idempotent re-acquire, writes nothing of the
			// lease, but must not confirm a grant the standby never received: its
			// commit waits for the standby too (pg_lease 0.4.0), and is cancelled.
			before = ss.interrupts.Load()
			_, ok, err = c.Acquire(ctx, key, "o", time.Hour)
			wantUnknown(t, "the owner's re-acquire", err, "acquire", lease.Token{Key: key, Owner: "o", Epoch: 1})
			if ok {
				t.Error("re-acquire reported ok")
			}
			ss.waitInterrupts(t, before+1)

			before = ss.interrupts.Load()
			if _, err = c.Renew(ctx, gr.Token, time.Hour); err == nil {
				t.Error("renew reported done")
			}
			wantUnknown(t, "renew", err, "renew", gr.Token)
			if s, err := ss.c.Inspect(ctx, gr.Key); err != nil || !s.ExpiresAt.After(gr.ExpiresAt) {
				t.Fatalf("inspect after the unknown renew: %+v %v; want the expiry moved on the primary", s, err)
			}
			ss.waitInterrupts(t, before+1)

			before = ss.interrupts.Load()
			err = c.Release(ctx, gl.Token)
			wantUnknown(t, "release", err, "release", gl.Token)
			if s, err := ss.c.Inspect(ctx, gl.Key); err != nil || s.Held {
				t.Fatalf("inspect after the unknown release: %+v %v; want free on the primary", s, err)
			}
			ss.waitInterrupts(t, before+1)
		})
	}
}

// TestCommitWhoseBackendIsTerminatedIsNotRetried: pg_terminate_backend
// during the wait sends the warning and closes the connection. The client
// must not treat that as a dead connection and send the acquire again: the
// second attempt would be the owner's re-acquire of a grant no standby has.
func TestCommitWhoseBackendIsTerminatedIsNotRetried(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	cs := make([]*lease.Client, len(clientKinds))
	for i, k := range clientKinds {
		cs[i] = lease.New(k.db(t, ss))
	}
	ss.startWaiting(t)
	ss.mode.Store("terminate")
	for i, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			before := ss.interrupts.Load()
			_, ok, err := cs[i].Acquire(ctx, k.name, "o", time.Hour)
			wantUnknown(t, "acquire", err, "acquire", lease.Token{Key: k.name, Owner: "o", Epoch: 1})
			if ok {
				t.Error("acquire reported ok")
			}
			ss.waitInterrupts(t, before+1)
		})
	}
}

// TestCommitOfCallersTransaction: Commit of the caller's own transaction
// reports the cancelled wait of its commit, on a pool with ObserveCommits,
// on a plain pool and on a plain connection. A nested transaction's Commit
// releases its savepoint and waits for nothing.
func TestCommitOfCallersTransaction(t *testing.T) {
	ss := newSyncServer(t)
	ctx := testCtx(t)
	ss.startWaiting(t)
	ss.mode.Store("cancel")
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			db := k.db(t, ss).(interface {
				Begin(context.Context) (pgx.Tx, error)
			})
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			nested, err := tx.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok, err := lease.New(nested).Acquire(ctx, k.name, "o", time.Hour); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if err := lease.Commit(ctx, nested); err != nil {
				t.Fatalf("Commit of the nested transaction: %v", err)
			}
			if err := lease.Commit(ctx, tx); !errors.Is(err, lease.ErrCommitUnknown) {
				t.Fatalf("Commit: %v, want ErrCommitUnknown", err)
			}
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("the transaction after Commit: %v, want it closed", err)
			}
			if s, err := ss.c.Inspect(ctx, k.name); err != nil || !s.Held {
				t.Fatalf("inspect after the unknown commit: %+v %v; want held on the primary", s, err)
			}
		})
	}
}

// TestObservedConnectionsCommitInOneStatement: on a pool with
// ObserveCommits a change is one statement; on any other pool the client
// wraps it in a transaction of its own (to read its COMMIT's reply).
func TestObservedConnectionsCommitInOneStatement(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	for _, observe := range []bool{true, false} {
		log := &pgtest.Statements{}
		pool := pgtest.NewPool(t, db.dsn, func(c *pgxpool.Config) {
			log.Traced(c)
			if observe {
				lease.ObserveCommits(&c.ConnConfig.Config)
			}
		})
		key := fmt.Sprintf("observed-%v", observe)
		g, ok, err := lease.New(pool).Acquire(ctx, key, "o", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		sent := log.All()
		began := slices.ContainsFunc(sent, func(s pgtest.Statement) bool { return s.SQL == "BEGIN" })
		if began == observe {
			t.Fatalf("ObserveCommits %v: statements %+v", observe, sent)
		}
		if err := lease.New(pool).Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
	}
}

package ha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/pglease/pg_lease/internal/patroni"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

const (
	dbName = "ha"
	// ttl of every elector; maxTTL is pg_lease's max_ttl (and so its
	// promotion grace) on the cluster.
	ttl    = 3 * time.Second
	maxTTL = 3 * time.Second
	// writeEvery is how often a leader makes a fenced write.
	writeEvery = 100 * time.Millisecond
)

// term is one leadership under one epoch on this process's monotonic clock:
// from the start of the leader callback to the end of the token's context.
type term struct {
	key, who   string
	epoch      int64
	start, end time.Time
	// fromEvents: read from a process's output, so start and end are
	// late by the pipe's delay (not used for the overlap check).
	fromEvents bool
}

// write is one acknowledged fenced write: committed in the cluster under
// fence.InTx (port: the node that took it) and then accepted by the guard
// outside the cluster (guarded false if the guard refused it).
type write struct {
	key, who   string
	epoch, seq int64
	port       int
	guarded    bool
	at         time.Time
}

// world is one mode's cluster, the guard server outside it, and everything
// that runs against them.
type world struct {
	t     *testing.T
	mode  patroni.Mode
	c     *patroni.Cluster
	dsn   string // multi-host, read-write
	guard *fence.PGGuard
	gpool *pgxpool.Pool
	keys  []string

	runCtx context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	seq    atomic.Int64

	warn   syncWarnings // of the electors' pools
	warned atomic.Int64 // fenced writes whose commit carried the warning
	calls  callLog      // the in-process candidates' calls (the breakdown)

	mu     sync.Mutex
	terms  []*term
	writes []write
	probe  *probe
	ledger *ledger
	ops    *operators
}

func newWorld(t *testing.T, mode patroni.Mode) *world {
	t.Helper()
	ctx := pgtest.Context(t, 3*time.Minute)
	slots := os.Getenv("PGLEASE_HA_SLOTS")
	switch slots {
	case "":
		slots = "pre-promote"
	case "off", "late":
	default:
		t.Fatalf("PGLEASE_HA_SLOTS=%q: want off, late, or unset (the standbys' slots created by a pre_promote script)", slots)
	}
	c, err := patroni.Start(ctx, patroni.Options{
		Mode:      mode,
		Etcd:      etcdBinary(t),
		Supervise: pgtest.BuildProgram(t, supervisePkg),
		NoSlots:   slots == "off",
		LateSlots: slots == "late",
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, mode: mode, c: c, dsn: c.MultiHostDSN(dbName)}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				t.Logf("%s log (tail):\n%s", n.Name, n.LogTail())
			}
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	leader, err := c.WaitHealthy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := leader.Connect(ctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	conn, err := leader.Connect(ctx, dbName)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := leaseadmin.InstallExtension(ctx, conn); err != nil {
		t.Fatalf("%v (make test-ha installs the extension files with make -C sql install)", err)
	}
	configure(t, ctx, conn)
	if mode == patroni.Strict {
		// Patroni's strict synchronous mode promotes only a synchronous
		// standby, and every commit waited for one: no acknowledged grant
		// can be missing on the new primary, so no grace is needed.
		if _, err := conn.Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE ha_writes (seq bigint PRIMARY KEY, key text NOT NULL, owner text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// The hold of faultMidCommit (nothing waits until it is set).
	if _, err := conn.Exec(ctx, holdSQL); err != nil {
		t.Fatal(err)
	}
	// The probe's first commit on each new primary goes here.
	if _, err := conn.Exec(ctx, `CREATE TABLE ha_probe (at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	var version, promotion string
	var grace time.Duration
	if err := conn.QueryRow(ctx, `SELECT e.extversion, s.promotion, s.promotion_grace
		FROM pg_extension e, lease.status() s WHERE e.extname = 'pg_lease'`).Scan(&version, &promotion, &grace); err != nil {
		t.Fatal(err)
	}
	t.Logf("Patroni cluster (%s, replication slots %s) on %s: pg_lease %s, max_ttl %v, promotion %s (grace %v), elector TTL %v",
		mode, slots, c.Dir(), version, maxTTL, promotion, grace, ttl)

	// The guard: a server outside the cluster.
	g := pgtest.New(t)
	gdsn, err := g.CreateDatabase(ctx, "guard")
	if err != nil {
		t.Fatal(err)
	}
	w.gpool = pgtest.NewPool(t, gdsn, pgtest.MaxConns(8))
	if w.guard, err = fence.NewPGGuard(w.gpool, fence.PGGuardOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.guard.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.gpool.Exec(ctx, `CREATE TABLE guard_writes (id bigserial PRIMARY KEY, seq bigint NOT NULL, key text NOT NULL, owner text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	w.runCtx, w.stop = context.WithCancel(context.Background())
	t.Cleanup(w.shutdown)
	w.probe = startProbe(w)
	return w
}

// configure lowers max_ttl before any grant: with no grant held, the lower
// value is the grace at once (pg_lease 0.4.0).
func configure(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	var grace time.Duration
	if err := conn.QueryRow(ctx, "SELECT promotion_grace FROM lease.configure(max_ttl => $1::interval)",
		fmt.Sprintf("%d milliseconds", maxTTL.Milliseconds())).Scan(&grace); err != nil {
		t.Fatal(err)
	}
	if grace != maxTTL {
		t.Fatalf("promotion grace %v after lowering max_ttl to %v on a database with no grant", grace, maxTTL)
	}
}

// shutdown stops every candidate and waits for them.
func (w *world) shutdown() {
	w.stop()
	w.wg.Wait()
}

// pool opens a pool on the cluster whose connections count the
// cancelled-wait warnings (w.warn, then opts' own counters) and report
// them to pkg/lease (lease.ObserveCommits: a change whose commit carried
// one is ErrCommitUnknown, not done).
func (w *world) pool(opts ...pgtest.PoolOption) *pgxpool.Pool {
	opts = append([]pgtest.PoolOption{pgtest.ConnectTimeout(2 * time.Second), pgtest.MaxConns(4), w.warn.option()}, opts...)
	opts = append(opts, func(c *pgxpool.Config) {
		lease.ObserveCommits(&c.ConnConfig.Config)
		lease.LeashSilentHostsPool(c)
	})
	return pgtest.NewPool(w.t, w.dsn, opts...)
}

// lead is a leader's work under token tok until ctx ends: a fenced write
// every writeEvery, in the cluster (fence.InTx) and then on the guard.
func (w *world) lead(ctx context.Context, pool *pgxpool.Pool, tok lease.Token) {
	tr := &term{key: tok.Key, who: tok.Owner, epoch: tok.Epoch, start: time.Now()}
	w.mu.Lock()
	w.terms = append(w.terms, tr)
	w.mu.Unlock()
	defer func() {
		at := time.Now()
		w.mu.Lock()
		tr.end = at
		w.mu.Unlock()
	}()
	for ctx.Err() == nil {
		w.fencedWrite(ctx, pool, tok)
		select {
		case <-ctx.Done():
		case <-time.After(writeEvery):
		}
	}
}

func (w *world) fencedWrite(ctx context.Context, pool *pgxpool.Pool, tok lease.Token) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	seq := w.seq.Add(1)
	var port int
	var warnings *atomic.Int64
	var before int64
	err := fence.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
		warnings = w.warn.of(tx.Conn().PgConn())
		before = warnings.Load()
		return tx.QueryRow(ctx, `INSERT INTO ha_writes (seq, key, owner, epoch) VALUES ($1, $2, $3, $4) RETURNING inet_server_port()`,
			seq, tok.Key, tok.Owner, tok.Epoch).Scan(&port)
	})
	if err != nil {
		if ctx.Err() == nil {
			w.calls.add(call{key: tok.Key, who: tok.Owner, kind: "write failed: " + err.Error(), start: time.Now(), end: time.Now()})
		}
		return
	}
	if warnings.Load() != before {
		// Committed locally, perhaps not replicated: not acknowledged.
		w.warned.Add(1)
		return
	}
	wr := write{key: tok.Key, who: tok.Owner, epoch: tok.Epoch, seq: seq, port: port}
	err = w.guard.Write(ctx, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO guard_writes (seq, key, owner, epoch) VALUES ($1, $2, $3, $4)`, seq, tok.Key, tok.Owner, tok.Epoch)
		return err
	})
	wr.guarded = err == nil
	wr.at = time.Now()
	if err != nil && !errors.Is(err, fence.ErrStale) && ctx.Err() == nil {
		w.t.Logf("guard write %s: %v", tok, err)
	}
	w.mu.Lock()
	w.writes = append(w.writes, wr)
	w.mu.Unlock()
}

// startElectors starts n pkg/elector candidates on key "elector".
func (w *world) startElectors(n int) {
	const key = "elector"
	w.keys = append(w.keys, key)
	for i := range n {
		who := fmt.Sprintf("elector-%d", i)
		pool := w.pool(w.calls.option(key, who))
		el, err := elector.New(lease.New(pool), elector.Config{Key: key, Identity: who, TTL: ttl,
			Callbacks: elector.Callbacks{OnStartedLeading: func(lctx context.Context) {
				tok, ok := lease.TokenFromContext(lctx)
				if !ok {
					w.t.Error("elector: no token in the leader context")
					return
				}
				w.lead(lctx, pool, tok)
			}}})
		if err != nil {
			w.t.Fatal(err)
		}
		w.wg.Go(func() { _ = el.Run(w.runCtx) })
	}
}

// startClientGo starts n client-go candidates (tools/leaderelection with
// pkg/resourcelock) on key "client-go".
func (w *world) startClientGo(n int) {
	const key = "client-go"
	w.keys = append(w.keys, key)
	for i := range n {
		who := fmt.Sprintf("client-go-%d", i)
		pool := w.pool(w.calls.option(key, who))
		lock, err := resourcelock.New(lease.New(pool), resourcelock.Config{Key: key, Identity: who, LeaseDuration: ttl})
		if err != nil {
			w.t.Fatal(err)
		}
		cfg := leaderelection.LeaderElectionConfig{
			Lock: lock, Name: key, LeaseDuration: ttl, RenewDeadline: 2 * time.Second,
			RetryPeriod: 400 * time.Millisecond, ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					for lctx.Err() == nil {
						tctx, cancel, err := lock.TokenContext(lctx)
						if err != nil { // between epochs
							select {
							case <-lctx.Done():
							case <-time.After(20 * time.Millisecond):
							}
							continue
						}
						tok, _ := lease.TokenFromContext(tctx)
						w.lead(tctx, pool, tok)
						cancel()
					}
				},
				OnStoppedLeading: func() {},
			},
		}
		w.wg.Go(func() {
			for w.runCtx.Err() == nil {
				le, err := leaderelection.NewLeaderElector(cfg)
				if err != nil {
					w.t.Error(err)
					return
				}
				le.Run(w.runCtx)
			}
		})
	}
}

// firstWrites returns, per key, the first acknowledged fenced write taken
// by the node on port after at (guard accepted too; an operator's store
// write is on whichever node takes writes).
func (w *world) firstWrites(after time.Time, port int) map[string]write {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]write{}
	for _, wr := range w.writes {
		if !wr.guarded || (wr.port != -1 && wr.port != port) || !wr.at.After(after) {
			continue
		}
		if cur, ok := out[wr.key]; !ok || wr.at.Before(cur.at) {
			out[wr.key] = wr
		}
	}
	return out
}

// awaitWrites waits until every key has a fenced write on port after at,
// and returns the latest of those first writes' times.
func (w *world) awaitWrites(ctx context.Context, after time.Time, port int) (map[string]write, error) {
	for {
		got := w.firstWrites(after, port)
		if len(got) == len(w.keys) {
			return got, nil
		}
		select {
		case <-ctx.Done():
			var missing []string
			for _, k := range w.keys {
				if _, ok := got[k]; !ok {
					missing = append(missing, k)
				}
			}
			sort.Strings(missing)
			return got, fmt.Errorf("no fenced write on port %d for %v: %w", port, missing, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (w *world) allTerms() []term {
	w.mu.Lock()
	out := make([]term, len(w.terms))
	for i, tr := range w.terms {
		out[i] = *tr
	}
	w.mu.Unlock()
	if w.ops != nil {
		out = append(out, w.ops.terms()...)
	}
	return out
}

func (w *world) allWrites() []write {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]write(nil), w.writes...)
}

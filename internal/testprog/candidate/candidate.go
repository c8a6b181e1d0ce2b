// Package candidate is the one candidate process of the test suites and the
// demo: run as internal/testprog/cmd/pglease-candidate (the elector's
// process tests, the failure suite, the failover tests) or by a program that
// re-executes itself (cmd/pglease-demo) and calls Main. It prints one JSON
// testprog.Event per line on stdout.
//
// Configuration, from the environment:
//
//	PGLEASE_TC_MODE      elector (default): campaign with pkg/elector;
//	                     holder: acquire with the bare client, renew in a loop
//	PGLEASE_TC_DSN       database holding pg_lease
//	PGLEASE_TC_STORE_DSN database of the guarded store (default: PGLEASE_TC_DSN)
//	PGLEASE_TC_KEY       lease key
//	PGLEASE_TC_ID        identity (owner)
//	PGLEASE_TC_TTL       lease TTL (Go duration)
//
// Elector mode:
//
//	PGLEASE_TC_RETRY     RetryInterval (Go duration)
//	PGLEASE_TC_WAITER    if set: followers wait with a listen.Waiter (LISTEN)
//	PGLEASE_TC_DEADLINES if set: a query whose context ended is interrupted
//	                     only if still unanswered half a minute later (an
//	                     interrupted query sends a cancel request, which
//	                     PgBouncer 1.18 can crash on)
//	PGLEASE_TC_WRITE     if set: while leading, write through a fence.PGGuard
//	                     on the store (INSERT INTO writes (epoch, owner)) at
//	                     once and then every WRITE (Go duration), without
//	                     looking at the leader context between the pause and
//	                     the write (a zombie writer): event "working" before
//	                     each pause, "write" after each write; once the
//	                     leader context is done it stops after a failed
//	                     write, or after one more write if the last one
//	                     succeeded (frozen mid-write)
//
// Holder mode (the failure suite's hung holder): acquire, then renew every
// PGLEASE_TC_EVERY, after every successful renewal a write through the
// epoch watermark guard (table guard(resource, epoch), effects(resource,
// epoch, writer)); once a renewal reports the grant lost, one more guarded
// write and one write fenced by lease.fence under the epoch it held, then
// "done". PGLEASE_TC_GUARD=broken drops the guard's epoch condition (the
// failure suite's deliberate break of its own guard).
//
// SIGTERM or SIGINT cancel the run: an elector resigns (releasing the lease)
// and the process exits 0.
package candidate

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/testprog"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// Event is testprog.Event.
type Event = testprog.Event

var outMu sync.Mutex

func emit(e Event) {
	if e.Wall == 0 {
		e.Wall = time.Now().UnixNano()
	}
	b, _ := json.Marshal(e)
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func dur(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err == nil {
			return d
		}
	}
	return def
}

// Main runs the candidate and exits.
func Main() {
	// No flags: the environment configures it (PGLEASE_TC_DSN, PGLEASE_TC_KEY,
	// ...; see the package documentation). An argument is a usage error.
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s (no arguments; configured by PGLEASE_TC_MODE, "+
			"PGLEASE_TC_DSN, PGLEASE_TC_STORE_DSN, PGLEASE_TC_KEY, PGLEASE_TC_ID, PGLEASE_TC_TTL, ...)\n", os.Args[0])
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	id := os.Getenv("PGLEASE_TC_ID")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	var err error
	switch mode := os.Getenv("PGLEASE_TC_MODE"); mode {
	case "", "elector":
		err = runElector(ctx, id)
	case "holder":
		err = runHolder(ctx, id)
	default:
		err = fmt.Errorf("PGLEASE_TC_MODE=%q: want elector or holder", mode)
	}
	stop()
	if err != nil {
		emit(Event{Ev: "error", ID: id, Err: err.Error()})
		os.Exit(1)
	}
	emit(Event{Ev: "exit", ID: id})
	os.Exit(0)
}

func runElector(ctx context.Context, id string) error {
	dsn := os.Getenv("PGLEASE_TC_DSN")
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// Warm each new connection: a handoff's first acquire and release then
	// cost what later ones do (no PL/pgSQL compile, no statement prepare).
	pcfg.AfterConnect = lease.WarmConn
	if os.Getenv("PGLEASE_TC_DEADLINES") != "" {
		pcfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn(), DeadlineDelay: 30 * time.Second}
		}
	}
	// Never acknowledge a change whose wait for the synchronous standbys was
	// cancelled (lease.ErrCommitUnknown).
	lease.ObserveCommits(&pcfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := pool
	if sd := os.Getenv("PGLEASE_TC_STORE_DSN"); sd != "" && sd != dsn {
		scfg, err := pgxpool.ParseConfig(sd)
		if err != nil {
			return err
		}
		lease.ObserveCommits(&scfg.ConnConfig.Config) // as the lease pool: fenced writes too
		if store, err = pgxpool.NewWithConfig(ctx, scfg); err != nil {
			return err
		}
		defer store.Close()
	}

	// Clock offset to the server, measured the way the tests compare
	// instants: server reading against the midpoint of the round trip.
	best := Event{Ev: "offset", ID: id, Uncert: int64(time.Hour)}
	for range 5 {
		var server time.Time
		t0 := time.Now()
		if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
			return err
		}
		t1 := time.Now()
		if u := t1.Sub(t0) / 2; int64(u) < best.Uncert {
			best.Uncert = int64(u)
			best.Offset = server.UnixNano() - t0.Add(u).UnixNano()
		}
	}
	emit(best)

	guard, err := fence.NewPGGuard(store, fence.PGGuardOptions{})
	if err != nil {
		return err
	}
	client := lease.New(pool)
	writeEvery := dur("PGLEASE_TC_WRITE", 0)
	ttl := dur("PGLEASE_TC_TTL", 2*time.Second)
	cfg := elector.Config{
		Key:           os.Getenv("PGLEASE_TC_KEY"),
		Identity:      id,
		TTL:           ttl,
		RetryInterval: dur("PGLEASE_TC_RETRY", 0),
	}
	if os.Getenv("PGLEASE_TC_WAITER") != "" {
		w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
		if err != nil {
			return err
		}
		defer w.Close()
		cfg.Waiter = w
	}
	var el *elector.Elector
	cfg.Callbacks = elector.Callbacks{
		OnStartedLeading: func(lctx context.Context) {
			tok, _ := lease.TokenFromContext(lctx)
			st := el.Status()
			g := st.Grant
			emit(Event{Ev: "started", ID: id, Epoch: tok.Epoch, Expires: g.ExpiresAt.UnixNano(),
				Acquired: g.ExpiresAt.Add(-g.TTL).UnixNano(), Deadline: st.Deadline.UnixNano()})
			go func() {
				<-lctx.Done()
				emit(Event{Ev: "cancelled", ID: id, Epoch: tok.Epoch, Cause: context.Cause(lctx).Error()})
			}()
			if writeEvery <= 0 {
				<-lctx.Done()
				return
			}
			zombie := context.WithoutCancel(lctx)
			extra := false
			for {
				err := guard.Write(zombie, tok, func(tx pgx.Tx) error {
					_, err := tx.Exec(zombie, "INSERT INTO writes (epoch, owner) VALUES ($1, $2)", tok.Epoch, id)
					return err
				})
				ev := Event{Ev: "write", ID: id, Epoch: tok.Epoch, Stale: errors.Is(err, fence.ErrStale)}
				if err != nil {
					ev.Err = err.Error()
				}
				emit(ev)
				if lctx.Err() != nil {
					// A process frozen in the middle of a write (not in
					// the pause) resumes with that write accepted (it
					// committed before the freeze) and a context already
					// cancelled: it still writes once more, as the zombie
					// it models, so that the guard's rejection is seen.
					if err != nil || extra {
						return
					}
					extra = true
				}
				// The pause between the check above and the next write:
				// a process stopped here writes once more after it
				// resumes, whatever its leader context says.
				emit(Event{Ev: "working", ID: id, Epoch: tok.Epoch})
				time.Sleep(writeEvery)
			}
		},
		OnStoppedLeading: func() {
			g := el.Status().Grant
			emit(Event{Ev: "stopped", ID: id, Epoch: g.Epoch, Expires: g.ExpiresAt.UnixNano()})
		},
	}
	el, err = elector.New(client, cfg)
	if err != nil {
		return err
	}
	// Report renewals: poll the status (the elector has no renewal hook).
	go func() {
		var last time.Time
		for ctx.Err() == nil {
			if s := el.Status(); s.Leading && !s.Grant.ExpiresAt.Equal(last) {
				last = s.Grant.ExpiresAt
				emit(Event{Ev: "renewed", ID: id, Epoch: s.Grant.Epoch, Expires: last.UnixNano(), Deadline: s.Deadline.UnixNano()})
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := el.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("run: %w", err)
	}
	return nil
}

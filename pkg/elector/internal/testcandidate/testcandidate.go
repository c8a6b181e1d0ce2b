// Package testcandidate is a leader-election candidate run as a separate OS
// process by the elector's tests (the test binary re-executes itself with
// EnvVar set and calls Main). It prints one JSON Event per line on stdout.
//
// Configuration, from the environment:
//
//	PGLEASE_TC_DSN       database holding pg_lease (and the guard table)
//	PGLEASE_TC_KEY       lease key
//	PGLEASE_TC_ID        identity
//	PGLEASE_TC_TTL       lease TTL (Go duration)
//	PGLEASE_TC_RETRY     RetryInterval (Go duration)
//	PGLEASE_TC_WRITE     if set: while leading, write through a fence.PGGuard
//	                     on resource "job" at once and then every WRITE
//	                     (Go duration), without looking at the leader context
//	                     between the pause and the write (a zombie writer)
//
// SIGTERM or SIGINT cancel Run's context: the candidate resigns (releasing
// the lease) and exits 0.
package testcandidate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

// EnvVar selects the candidate in a re-executed test binary.
const EnvVar = "PGLEASE_TESTCANDIDATE"

// Event is one line of output.
type Event struct {
	Ev string `json:"ev"` // offset, started, renewed, cancelled, stopped, write, exit, error
	ID string `json:"id"`
	// Wall is the local wall clock (unix ns) when the event happened.
	Wall  int64 `json:"wall"`
	Epoch int64 `json:"epoch,omitempty"`
	// Expires is the server-clock expiry (unix ns) of the grant (started,
	// renewed, stopped: the term's latest grant); Acquired its start.
	Expires  int64 `json:"expires,omitempty"`
	Acquired int64 `json:"acquired,omitempty"`
	// Deadline is the term's local deadline (unix ns, local wall clock):
	// the end of its leadership on the local clock unless cancelled
	// earlier.
	Deadline int64  `json:"deadline,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Err      string `json:"err,omitempty"`
	Stale    bool   `json:"stale,omitempty"`
	// Offset is the server clock minus the local clock (ns), Uncert its
	// uncertainty (half the round trip).
	Offset int64 `json:"offset,omitempty"`
	Uncert int64 `json:"uncert,omitempty"`
}

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
	id := os.Getenv("PGLEASE_TC_ID")
	if err := run(id); err != nil {
		emit(Event{Ev: "error", ID: id, Err: err.Error()})
		os.Exit(1)
	}
	emit(Event{Ev: "exit", ID: id})
	os.Exit(0)
}

func run(id string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("PGLEASE_TC_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()

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

	guard, err := fence.NewPGGuard(pool, fence.PGGuardOptions{})
	if err != nil {
		return err
	}
	writeEvery := dur("PGLEASE_TC_WRITE", 0)
	ttl := dur("PGLEASE_TC_TTL", 2*time.Second)
	var el *elector.Elector
	el, err = elector.New(lease.New(pool), elector.Config{
		Key:           os.Getenv("PGLEASE_TC_KEY"),
		Identity:      id,
		TTL:           ttl,
		RetryInterval: dur("PGLEASE_TC_RETRY", 0),
		Callbacks: elector.Callbacks{
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
						return
					}
					// The pause between the check above and the next write:
					// a process stopped here writes once more after it
					// resumes, whatever its leader context says.
					time.Sleep(writeEvery)
				}
			},
			OnStoppedLeading: func() {
				g := el.Status().Grant
				emit(Event{Ev: "stopped", ID: id, Epoch: g.Epoch, Expires: g.ExpiresAt.UnixNano()})
			},
		},
	})
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
	if err := el.Run(ctx); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	return nil
}

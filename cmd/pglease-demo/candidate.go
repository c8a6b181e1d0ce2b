package main

import (
	"context"
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

// candidateMain runs one candidate: it campaigns for the key with
// pkg/elector and, while leading, writes to the store through a fence guard
// every few hundred milliseconds. Each step is a line on stdout:
// "LEADING <epoch>", "WORKING <epoch>", "WRITE-OK <epoch>",
// "WRITE-REJECTED <epoch> <why>", "STOPPED <epoch> <cause>".
func candidateMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runCandidate(ctx, os.Getenv("PGLEASE_DEMO_NAME"), os.Getenv("PGLEASE_DEMO_DSN"), os.Getenv("PGLEASE_DEMO_STORE_DSN")); err != nil {
		emit("ERROR", 0, err.Error())
		return 1
	}
	return 0
}

var emitMu sync.Mutex

func emit(kind string, epoch int64, detail string) {
	emitMu.Lock()
	defer emitMu.Unlock()
	fmt.Printf("%s %d %s\n", kind, epoch, detail)
}

func runCandidate(ctx context.Context, name, dsn, storeDSN string) error {
	leases, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer leases.Close()
	store, err := pgxpool.New(ctx, storeDSN)
	if err != nil {
		return err
	}
	defer store.Close()
	guard, err := fence.NewPGGuard(store, fence.PGGuardOptions{})
	if err != nil {
		return err
	}
	client := lease.New(leases)
	w, err := lease.NewWaiter(ctx, dsn, lease.WaiterOptions{})
	if err != nil {
		return err
	}
	defer w.Close()

	el, err := elector.New(client, elector.Config{
		Key:      key,
		Identity: name,
		TTL:      ttl,
		Waiter:   w,
		Callbacks: elector.Callbacks{OnStartedLeading: func(lctx context.Context) {
			tok, _ := lease.TokenFromContext(lctx)
			emit("LEADING", tok.Epoch, "")
			for lctx.Err() == nil {
				// A unit of work under the token: prepare, then write. A
				// pause (GC, SIGSTOP) may hit between the two.
				emit("WORKING", tok.Epoch, "")
				time.Sleep(300 * time.Millisecond)
				err := guard.Write(context.WithoutCancel(lctx), tok, func(tx pgx.Tx) error {
					_, err := tx.Exec(lctx, `SELECT 1`)
					return err
				})
				switch {
				case err == nil:
					emit("WRITE-OK", tok.Epoch, "")
				case errors.Is(err, fence.ErrStale):
					emit("WRITE-REJECTED", tok.Epoch, err.Error())
				default:
					emit("WRITE-FAILED", tok.Epoch, err.Error())
				}
			}
			emit("STOPPED", tok.Epoch, fmt.Sprint(context.Cause(lctx)))
		}},
	})
	if err != nil {
		return err
	}
	err = el.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

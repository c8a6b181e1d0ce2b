// Command holder is the failure suite's holder process: it acquires a key,
// then renews it in a loop, after every successful renewal making a write
// through an epoch watermark guard. Once a renewal fails with a lost grant
// it tries one more guarded write and one write fenced by lease.fence under
// the epoch it held, and exits. Every result is one line on stdout:
//
//	acquired <epoch>
//	renew ok <epoch>
//	renew lapsed | renew not_owner | renew epoch_mismatch
//	renew error <message>          (connection trouble: it keeps trying)
//	write <epoch> accepted|rejected
//	fence <epoch> accepted|lapsed|not_owner|epoch_mismatch|error <message>
//	done
//
// The test freezes it with SIGSTOP while its grant lapses and another owner
// takes over, and reads these lines after SIGCONT.
//
// The guard is the table guard(resource text PRIMARY KEY, epoch bigint): a
// write is accepted when UPDATE guard SET epoch = e WHERE resource = r AND
// epoch <= e changes the row, and is then recorded in effects(resource,
// epoch, writer) in the same transaction. -guard=broken drops the epoch
// condition (the suite's deliberate break of its own guard).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
)

func main() {
	dsn := flag.String("dsn", "", "database DSN")
	key := flag.String("key", "res", "lease key (also the guarded resource)")
	owner := flag.String("owner", "holder", "owner name")
	ttl := flag.Duration("ttl", time.Second, "lease TTL")
	every := flag.Duration("every", 200*time.Millisecond, "pause between renewals")
	guard := flag.String("guard", "strict", "strict, or broken (no epoch condition)")
	flag.Parse()
	if err := run(*dsn, *key, *owner, *ttl, *every, *guard == "broken"); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		os.Exit(1)
	}
}

func run(dsn, key, owner string, ttl, every time.Duration, brokenGuard bool) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	c := lease.New(conn)

	var g lease.Grant
	for {
		var ok bool
		g, ok, err = c.Acquire(ctx, key, owner, ttl)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		time.Sleep(every)
	}
	fmt.Printf("acquired %d\n", g.Epoch)

	for {
		time.Sleep(every)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Renew(rctx, g.Token, ttl)
		cancel()
		switch {
		case err == nil:
			fmt.Printf("renew ok %d\n", g.Epoch)
			write(ctx, conn, key, owner, g.Epoch, brokenGuard)
			continue
		case errors.Is(err, lease.ErrLapsed):
			fmt.Println("renew lapsed")
		case errors.Is(err, lease.ErrNotOwner):
			fmt.Println("renew not_owner")
		case errors.Is(err, lease.ErrEpochMismatch):
			fmt.Println("renew epoch_mismatch")
		default:
			fmt.Printf("renew error %v\n", err)
			continue
		}
		break
	}
	// The process acts on what it decided before it learnt of the loss: one
	// more guarded write and one fenced write, both under its old epoch.
	write(ctx, conn, key, owner, g.Epoch, brokenGuard)
	fenced(ctx, conn, g.Token)
	fmt.Println("done")
	return nil
}

// write is a write through the epoch watermark guard.
func write(ctx context.Context, conn *pgx.Conn, key, owner string, epoch int64, broken bool) {
	q := `UPDATE guard SET epoch = $2 WHERE resource = $1 AND epoch <= $2`
	if broken {
		q = `UPDATE guard SET epoch = $2 WHERE resource = $1`
	}
	accepted := false
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, q, key, epoch)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		accepted = true
		_, err = tx.Exec(ctx, `INSERT INTO effects (resource, epoch, writer) VALUES ($1, $2, $3)`, key, epoch, owner+"/guard")
		return err
	})
	switch {
	case err != nil:
		fmt.Printf("write %d error %v\n", epoch, err)
	case accepted:
		fmt.Printf("write %d accepted\n", epoch)
	default:
		fmt.Printf("write %d rejected\n", epoch)
	}
}

// fenced is a write in the lease's own database fenced by lease.fence.
func fenced(ctx context.Context, conn *pgx.Conn, t lease.Token) {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := lease.Fence(ctx, tx, t); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (resource, epoch, writer) VALUES ($1, $2, $3)`, t.Key, t.Epoch, t.Owner+"/fence")
		return err
	})
	switch {
	case err == nil:
		fmt.Printf("fence %d accepted\n", t.Epoch)
	case errors.Is(err, lease.ErrLapsed):
		fmt.Printf("fence %d lapsed\n", t.Epoch)
	case errors.Is(err, lease.ErrNotOwner):
		fmt.Printf("fence %d not_owner\n", t.Epoch)
	case errors.Is(err, lease.ErrEpochMismatch):
		fmt.Printf("fence %d epoch_mismatch\n", t.Epoch)
	default:
		fmt.Printf("fence %d error %v\n", t.Epoch, err)
	}
}

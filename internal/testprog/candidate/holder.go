package candidate

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

func runHolder(ctx context.Context, owner string) error {
	key := os.Getenv("PGLEASE_TC_KEY")
	ttl := dur("PGLEASE_TC_TTL", time.Second)
	every := dur("PGLEASE_TC_EVERY", 200*time.Millisecond)
	broken := os.Getenv("PGLEASE_TC_GUARD") == "broken"
	conn, err := pgx.Connect(ctx, os.Getenv("PGLEASE_TC_DSN"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	c := lease.New(conn)

	var g lease.Grant
	for {
		var ok bool
		g, ok, err = c.Acquire(ctx, key, owner, ttl)
		if listen.WaitOutGrace(ctx, c, err) {
			continue // a promotion's grace: asked again when it ends
		}
		if err != nil {
			return err
		}
		if ok {
			break
		}
		time.Sleep(every)
	}
	emit(Event{Ev: "acquired", ID: owner, Epoch: g.Epoch})

	for {
		time.Sleep(every)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Renew(rctx, g.Token, ttl)
		cancel()
		ev := Event{Ev: "renew", ID: owner, Epoch: g.Epoch, Status: outcome(err)}
		if ev.Status == "error" {
			ev.Err = err.Error()
		}
		emit(ev)
		if err == nil {
			write(ctx, conn, key, owner, g.Epoch, broken)
			continue
		}
		if ev.Status == "error" { // connection trouble: keep trying
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		break
	}
	// The process acts on what it decided before it learnt of the loss: one
	// more guarded write and one fenced write, both under its old epoch.
	write(ctx, conn, key, owner, g.Epoch, broken)
	fenced(ctx, conn, g.Token)
	emit(Event{Ev: "done", ID: owner})
	return nil
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lease.ErrLapsed):
		return "lapsed"
	case errors.Is(err, lease.ErrNotOwner):
		return "not_owner"
	case errors.Is(err, lease.ErrEpochMismatch):
		return "epoch_mismatch"
	}
	return "error"
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
	ev := Event{Ev: "write", ID: owner, Epoch: epoch, Status: "rejected"}
	switch {
	case err != nil:
		ev.Status, ev.Err = "error", err.Error()
	case accepted:
		ev.Status = "accepted"
	}
	emit(ev)
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
	ev := Event{Ev: "fence", ID: t.Owner, Epoch: t.Epoch, Status: outcome(err)}
	if err == nil {
		ev.Status = "accepted"
	} else if ev.Status == "error" {
		ev.Err = err.Error()
	}
	emit(ev)
}

package listen

// The Waiter's connection loop: one dedicated connection that LISTENs,
// waits for notifications, and is made again after any loss.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// channel is the NOTIFY channel on which pg_lease announces grants,
// releases and force-releases (not renewals, not lapses: expiry is lazy).
const channel = "pg_lease"

// connect opens the connection and LISTENs.
func (w *Waiter) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return nil, fmt.Errorf("listen: waiter: connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("listen: waiter: LISTEN %s: %w", channel, err)
	}
	return conn, nil
}

// run owns the connection: it waits for notifications and re-establishes
// the connection after a loss.
func (w *Waiter) run(conn *pgx.Conn) {
	defer close(w.loopDone)
	defer func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			// Best effort: a gone backend's registrations linger (costing
			// notifications) until the next lease.listen by anyone.
			w.mu.Lock()
			registered := (len(w.regs.live) > 0 || w.regs.all) && !w.regs.unsupported
			w.mu.Unlock()
			if registered {
				_, _ = conn.Exec(ctx, `SELECT lease.unlisten('*')`)
			}
			_ = conn.Close(ctx)
			cancel()
		}
		w.shutdown()
	}()
	if conn != nil {
		w.event("listening", "")
	}
	backoff := w.opts.ReconnectMin
	retryAt := time.Time{}
	for w.ctx.Err() == nil {
		if conn == nil {
			c, err := w.connect(w.ctx)
			if err != nil {
				w.event("connect_failed", err.Error())
				d := backoff/2 + rand.N(backoff/2+1)
				backoff = min(2*backoff, w.opts.ReconnectMax)
				t := time.NewTimer(d)
				select {
				case <-w.ctx.Done():
					t.Stop()
					return
				case <-t.C:
				case <-w.reachedC:
					t.Stop()
				}
				continue
			}
			select { // a read that reached the server while this connected
			case <-w.reachedC:
			default:
			}
			conn, backoff = c, w.opts.ReconnectMin
			w.connUp(true)
			// Register every wanted key again before telling the
			// subscribers to read again (a key whose row stays locked is
			// retried for at most QueryTimeout).
			if err := w.resyncRegistrations(conn); err != nil && w.ctx.Err() == nil {
				w.event("conn_lost", err.Error())
				w.connUp(false)
				_ = conn.Close(context.Background())
				conn = nil
				continue
			}
			w.resync()
			w.event("listening", "")
		}
		err := error(nil)
		w.mu.Lock()
		dirty := w.regs.dirty
		w.mu.Unlock()
		if dirty || (!retryAt.IsZero() && !time.Now().Before(retryAt)) {
			var retry bool
			retry, err = w.syncRegistrations(conn)
			retryAt = time.Time{}
			if retry {
				retryAt = time.Now().Add(10 * time.Millisecond)
			}
			w.mu.Lock()
			if nd := w.regs.nextDrop; !nd.IsZero() && (retryAt.IsZero() || nd.Before(retryAt)) {
				retryAt = nd
			}
			w.mu.Unlock()
		}
		if err == nil {
			err = w.step(conn, retryAt)
		}
		if err != nil && w.ctx.Err() == nil {
			w.event("conn_lost", err.Error())
			w.connUp(false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
		}
	}
}

// reached tells a Waiter without a connection that a read through a lease.Client
// has just reached the server. The Waiter ends its reconnection backoff and
// connects now. After a failover the backoff may have grown to seconds, and
// every notification is missed until the connection is back.
func (w *Waiter) reached() {
	w.mu.Lock()
	down := !w.regs.up && !w.closed
	w.mu.Unlock()
	if down {
		select {
		case w.reachedC <- struct{}{}:
		default:
		}
	}
}

// keepalive is how long the connection may stay silent before the waiter
// checks it with a query. A connection that died without a word (a dropped
// route, a frozen proxy) is found within keepalive + QueryTimeout.
const keepalive = time.Minute

// step waits for one notification, or checks the connection after
// keepalive of silence. It returns an error when the connection is lost.
// A registration change (or retryAt, when not zero) ends the wait early.
func (w *Waiter) step(conn *pgx.Conn, retryAt time.Time) error {
	d := keepalive
	if !retryAt.IsZero() {
		d = max(time.Until(retryAt), 0)
	}
	kctx, kick := context.WithCancelCause(w.ctx)
	wctx, cancel := context.WithTimeout(kctx, d)
	w.mu.Lock()
	if w.regs.dirty {
		w.mu.Unlock()
		cancel()
		kick(nil)
		return nil
	}
	w.regs.kick = func() { kick(errKick) }
	w.mu.Unlock()
	w.waiting.Store(true)
	n, err := conn.WaitForNotification(wctx)
	w.waiting.Store(false)
	w.mu.Lock()
	w.regs.kick = nil
	w.mu.Unlock()
	kicked := context.Cause(kctx) == errKick
	cancel()
	kick(nil)
	if n != nil {
		w.notified(n)
	}
	if err == nil || w.ctx.Err() != nil {
		return nil
	}
	if !conn.IsClosed() && (kicked || !retryAt.IsZero()) {
		return nil // ended early on purpose: the connection is fine
	}
	if conn.IsClosed() || wctx.Err() == nil {
		return err
	}
	qctx, cancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer cancel()
	_, err = conn.Exec(qctx, `SELECT 1`)
	return err
}

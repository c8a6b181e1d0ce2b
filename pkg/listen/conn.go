package listen

// The Waiter's connection: one dedicated connection that LISTENs, waits
// for notifications, and is made again after any loss.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// channel is the NOTIFY channel on which pg_lease announces grants,
// releases and force-releases (not renewals, not lapses: expiry is lazy).
const channel = "pg_lease"

// keepalive is how long the connection may stay silent before the waiter
// checks it with a query. A connection that died without a word (a dropped
// route, a frozen proxy) is found within keepalive + QueryTimeout.
const keepalive = time.Minute

// interrupter ends a wait for notifications at once, by a deadline on the
// socket, and lets a query run on for up to delay after its context ended.
// pgx closes a connection whose query it interrupted and sends a cancel
// request as it does, whatever the handler; PgBouncer 1.18 can crash on
// one. An interrupted wait sends nothing and keeps the connection. (A
// socket's deadline is on the real clock.)
type interrupter struct {
	conn    net.Conn
	waiting *atomic.Bool
	delay   time.Duration
}

func (h *interrupter) HandleCancel(context.Context) {
	d := h.delay
	if h.waiting.Load() {
		d = 0
	}
	_ = h.conn.SetDeadline(time.Now().Add(d))
}

func (h *interrupter) HandleUnwatchAfterCancel() { _ = h.conn.SetDeadline(time.Time{}) }

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
	defer func() { w.hangUp(conn) }()
	if conn != nil {
		w.emit.emit(sigListening, "")
	}
	backoff := w.opts.ReconnectMin
	var retryAt time.Time
	for w.ctx.Err() == nil {
		if conn == nil {
			if conn = w.reconnect(&backoff); conn == nil {
				continue
			}
		}
		err := error(nil)
		dirty, _, _ := w.regs.state()
		if dirty || (!retryAt.IsZero() && !w.clk.Now().Before(retryAt)) {
			var retry bool
			retry, err = w.regs.sync(w.ctx, conn)
			retryAt = time.Time{}
			if retry {
				retryAt = w.clk.Now().Add(10 * time.Millisecond)
			}
			if _, nd, _ := w.regs.state(); !nd.IsZero() && (retryAt.IsZero() || nd.Before(retryAt)) {
				retryAt = nd
			}
		}
		if err == nil {
			err = w.step(conn, retryAt)
		}
		if err != nil && w.ctx.Err() == nil {
			w.emit.emit(sigConnLost, err.Error())
			w.regs.connUp(false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
		}
	}
}

// hangUp ends the Waiter: it drops the registrations (best effort: a gone
// backend's linger, costing notifications, until the next lease.listen by
// anyone), closes the connection and every subscription.
func (w *Waiter) hangUp(conn *pgx.Conn) {
	if conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if w.regs.registered() {
			_, _ = conn.Exec(ctx, `SELECT lease.unlisten('*')`)
		}
		_ = conn.Close(ctx)
		cancel()
	}
	w.regs.shutdown()
	w.subs.close()
}

// reconnect makes the connection again, after the backoff when it fails
// (nil then). It registers every wanted key again before telling the
// subscribers to read again (a key whose row stays locked is retried for
// at most QueryTimeout).
func (w *Waiter) reconnect(backoff *time.Duration) *pgx.Conn {
	conn, err := w.connect(w.ctx)
	if err != nil {
		w.emit.emit(sigConnectFailed, err.Error())
		d := *backoff/2 + rand.N(*backoff/2+1)
		*backoff = min(2**backoff, w.opts.ReconnectMax)
		t := w.clk.NewTimer(d)
		defer t.Stop()
		select {
		case <-w.ctx.Done():
		case <-t.C():
		case <-w.reachedC:
		}
		return nil
	}
	select { // a read that reached the server while this connected
	case <-w.reachedC:
	default:
	}
	*backoff = w.opts.ReconnectMin
	w.regs.connUp(true)
	if err := w.resyncRegistrations(conn); err != nil && w.ctx.Err() == nil {
		w.emit.emit(sigConnLost, err.Error())
		w.regs.connUp(false)
		_ = conn.Close(context.Background())
		return nil
	}
	w.subs.resync("*")
	w.emit.emit(sigListening, "")
	return conn
}

// resyncRegistrations is regs.sync until nothing is left to retry (at most
// QueryTimeout).
func (w *Waiter) resyncRegistrations(conn *pgx.Conn) error {
	deadline := w.clk.Now().Add(w.opts.QueryTimeout)
	for {
		retry, err := w.regs.sync(w.ctx, conn)
		if err != nil || !retry || !w.clk.Now().Before(deadline) {
			return err
		}
		t := w.clk.NewTimer(10 * time.Millisecond)
		select {
		case <-w.ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// reached tells a Waiter without a connection that a read through a
// lease.Client has just reached the server. The Waiter ends its
// reconnection backoff and connects now. After a failover the backoff may
// have grown to seconds, and every notification is missed until the
// connection is back.
func (w *Waiter) reached() {
	if w.regs.isUp() || w.subs.isClosed() {
		return
	}
	select {
	case w.reachedC <- struct{}{}:
	default:
	}
}

// step waits for one notification, or checks the connection after
// keepalive of silence. It returns an error when the connection is lost.
// A registration change (or retryAt, when not zero) ends the wait early.
func (w *Waiter) step(conn *pgx.Conn, retryAt time.Time) error {
	d := keepalive
	if !retryAt.IsZero() {
		d = max(retryAt.Sub(w.clk.Now()), 0)
	}
	kctx, kick := context.WithCancelCause(w.ctx)
	defer kick(nil)
	wctx, cancel := context.WithCancelCause(kctx)
	defer cancel(nil)
	if w.regs.setKick(func() { kick(errKick) }) {
		return nil // a sync is due
	}
	t := w.clk.NewTimer(d)
	defer t.Stop()
	stopTimer := make(chan struct{})
	defer close(stopTimer)
	go func() {
		select {
		case <-t.C():
			cancel(errSilent)
		case <-stopTimer:
		}
	}()
	w.waiting.Store(true)
	n, err := conn.WaitForNotification(wctx)
	w.waiting.Store(false)
	w.regs.setKick(nil)
	kicked := context.Cause(kctx) == errKick
	if n != nil {
		w.notified(n)
	}
	if err == nil || w.ctx.Err() != nil {
		return nil
	}
	if !conn.IsClosed() && (kicked || !retryAt.IsZero()) {
		return nil // ended early on purpose: the connection is fine
	}
	if conn.IsClosed() || context.Cause(wctx) != errSilent {
		return err
	}
	qctx, qcancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer qcancel()
	_, err = conn.Exec(qctx, `SELECT 1`)
	return err
}

// errSilent ends a wait for notifications after keepalive (or at a retry).
var errSilent = errors.New("listen: waiter: silent")

// notified dispatches a notification.
func (w *Waiter) notified(n *pgconn.Notification) {
	if n.Channel != channel {
		return
	}
	ev, ok := parse(n, w.clk.Now())
	if !ok {
		w.emit.emit(sigBadPayload, n.Payload)
		return
	}
	w.emit.emit(sigNotified, ev.Key)
	w.subs.notify(ev)
}

package listen

// The Waiter's registry of lease.listen registrations: which keys some
// subscriber waits for, and which the server holds for this backend.

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// registry is the Waiter's bookkeeping of lease.listen registrations (with
// pg_lease.notify = waiters, the default, a grant or release
// notifies only when some backend registered its key, or '*'). Every key a
// Watch subscription (and so every Await) waits for is registered on the
// listen connection before the subscription reads anything, and dropped
// when its last subscription ends. Guarded by Waiter.mu; only the run
// goroutine talks to the server.
type registry struct {
	want  map[string]int           // key ('*': every key) -> live subscriptions
	live  map[string]bool          // registered on the current connection
	ready map[string]chan struct{} // closed when the key is live (or the attempt ended)
	up    bool                     // a connection listens (registration is possible)
	dirty bool                     // want and live differ: the run goroutine must sync
	kick  func()                   // interrupts the run goroutine's wait for a notification
	// idle: when the last subscription of a live key ended; the key is
	// dropped registrationLinger later unless a subscription comes back
	// (a follower that re-awaits right away costs no unlisten + listen).
	idle     map[string]time.Time
	nextDrop time.Time // the earliest pending drop (zero: none)
	// late: keys whose listen waited behind a locked row (55P03, retried):
	// their subscribers may have stopped waiting and read without the
	// registration, so the listen that succeeds sends them a resync event.
	late map[string]bool
	// unsupported: the server has no lease.listen (pg_lease before 0.3.0,
	// which notifies every change): registering is a no-op.
	unsupported bool
	// all: '*' is registered on this connection because a key went beyond
	// the server's bound on one session's registrations (54000). It covers
	// every key: listen of a new key adds no row and only waits for a change
	// of the key in flight, until the connection ends.
	all bool
	// covered: live keys registered through '*' only (no unlisten to send).
	covered map[string]bool
}

// registerLocked counts a subscription to keys and returns the channels to
// wait on for the keys not yet registered on the current connection.
func (w *Waiter) registerLocked(keys []string) []chan struct{} {
	r := &w.regs
	if r.want == nil {
		r.want, r.live, r.ready = map[string]int{}, map[string]bool{}, map[string]chan struct{}{}
	}
	var pending []chan struct{}
	for _, k := range keys {
		r.want[k]++
		delete(r.idle, k)
		if r.live[k] || !r.up || r.unsupported {
			// live: nothing to do. Not up: the reconnection registers every
			// wanted key before its resync event, which makes the subscriber
			// read again.
			continue
		}
		ch := r.ready[k]
		if ch == nil {
			ch = make(chan struct{})
			r.ready[k] = ch
		}
		pending = append(pending, ch)
		r.dirty = true
	}
	if r.dirty && r.kick != nil {
		r.kick()
	}
	return pending
}

// unregisterLocked ends a subscription to keys; a key nobody waits for any
// more is dropped from the server by the run goroutine.
func (w *Waiter) unregisterLocked(keys []string) {
	r := &w.regs
	for _, k := range keys {
		if r.want[k]--; r.want[k] <= 0 {
			delete(r.want, k)
			if r.live[k] {
				if r.idle == nil {
					r.idle = map[string]time.Time{}
				}
				r.idle[k] = time.Now()
				r.dirty = true
			}
		}
	}
	if r.dirty && r.kick != nil {
		r.kick()
	}
}

// errKick ends a wait for a notification early: registrations changed.
var errKick = errors.New("listen: waiter: registrations changed")

// syncRegistrations makes the server's registrations of this backend match
// the wanted keys: lease.listen for each new key, lease.unlisten for each key
// nobody waits for. Each call is its own transaction (regQuery) on the
// listen connection, never inside a caller's transaction: listen's FOR SHARE
// lock on the key's row lasts microseconds, and lock_timeout (set in that
// transaction) bounds how long it waits behind a transaction that keeps the
// row locked (a holder renewing inside a long transaction); on that timeout
// the key stays pending and is tried again after the next notifications are
// dispatched, while its subscriber waits (at most QueryTimeout, then it
// reads and polls). It returns an error when the connection is lost.
func (w *Waiter) syncRegistrations(conn *pgx.Conn) (retry bool, err error) {
	r := &w.regs
	for {
		w.mu.Lock()
		r.dirty = false
		var add, drop []string
		if !r.unsupported {
			for k := range r.want {
				if !r.live[k] {
					add = append(add, k)
				}
			}
			r.nextDrop = time.Time{}
			now := time.Now()
			stays := func(k string) bool {
				return r.want[k] > 0 || now.Before(r.idle[k].Add(registrationLinger))
			}
			// lease.unlisten('*') drops every registration of the backend:
			// '*' goes only when no other key stays, and never while it
			// covers the keys beyond the server's bound.
			others := false
			for k := range r.live {
				others = others || (k != "*" && stays(k))
			}
			for k := range r.live {
				if r.want[k] > 0 {
					continue
				}
				at := r.idle[k].Add(registrationLinger)
				if k == "*" && (r.all || others) {
					at = now.Add(registrationLinger) // looked at again then
				}
				if now.Before(at) {
					if r.nextDrop.IsZero() || at.Before(r.nextDrop) {
						r.nextDrop = at
					}
					continue
				}
				if !r.covered[k] {
					drop = append(drop, k)
				}
				delete(r.live, k) // a new subscriber waits for the next listen
				delete(r.idle, k)
				delete(r.covered, k)
			}
		}
		w.mu.Unlock()
		if len(add) == 0 && len(drop) == 0 {
			return retry, nil
		}
		// (drop happens only once the key's linger passed)
		for _, k := range drop {
			if err := w.regQuery(conn, `SELECT lease.unlisten($1)`, k); err != nil {
				if w.noListen(err) {
					break
				}
				if !isPgError(err) {
					return false, err
				}
				w.event("unlisten_failed", k+": "+err.Error())
				continue
			}
			w.event("unlisten", k)
		}
		for _, k := range add {
			w.mu.Lock()
			covered := r.all
			w.mu.Unlock()
			// Under '*' the server adds no row for k; the call still waits
			// for a change of k in flight.
			err := w.listen(conn, k)
			if isTooManyRegistrations(err) && k != "*" && !covered {
				// This session holds as many registrations as the server
				// allows: register '*' beside them, which covers every key.
				if err = w.listen(conn, "*"); err == nil {
					w.mu.Lock()
					r.all = true
					w.mu.Unlock()
					w.event("listen_all", k)
					covered = true
					err = w.listen(conn, k)
				}
			}
			switch {
			case err == nil:
				w.event("listen", k)
			case w.noListen(err):
			case isLockTimeout(err):
				// A transaction keeps the key's row locked: try again soon,
				// after dispatching what arrived meanwhile.
				w.event("listen_locked", k)
				w.mu.Lock()
				if r.late == nil {
					r.late = map[string]bool{}
				}
				r.late[k] = true
				w.mu.Unlock()
				retry = true
				continue
			case !isPgError(err):
				return false, err
			default:
				// Refused (a standby, a read-only session, a key the server
				// rejects): the subscriber is not held; it reads and polls.
				w.event("listen_failed", k+": "+err.Error())
			}
			w.mu.Lock()
			if r.late[k] {
				delete(r.late, k)
				w.resyncKeyLocked(k)
			}
			r.live[k] = true // dropped on the next pass if nobody wants it any more
			if covered {
				if r.covered == nil {
					r.covered = map[string]bool{}
				}
				r.covered[k] = true
			}
			if ch := r.ready[k]; ch != nil {
				close(ch)
				delete(r.ready, k)
			}
			w.mu.Unlock()
		}
		if retry {
			return true, nil
		}
	}
}

// listen registers key on conn: lease.listen, then once more after that
// commit. The second call waits for a change of the key that was in flight
// before the registration (pg_lease 0.4.0; a no-op before).
func (w *Waiter) listen(conn *pgx.Conn, key string) error {
	if err := w.regQuery(conn, `SELECT lease.listen($1)`, key); err != nil {
		return err
	}
	return w.regQuery(conn, `SELECT lease.listen($1)`, key)
}

// registrationLinger is how long a key stays registered after its last
// subscription ended.
const registrationLinger = time.Second

// resyncRegistrations is syncRegistrations until nothing is left to retry
// (at most QueryTimeout).
func (w *Waiter) resyncRegistrations(conn *pgx.Conn) error {
	deadline := time.Now().Add(w.opts.QueryTimeout)
	for {
		retry, err := w.syncRegistrations(conn)
		if err != nil || !retry || !time.Now().Before(deadline) {
			return err
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-w.ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// regQuery runs a registration call in a transaction of its own under a
// short lock_timeout: lease.listen's lock on the key's row may wait behind a
// transaction that keeps it, and the waiter does not stall its notifications
// for long behind one (syncRegistrations retries). The setting is local to
// the transaction: never a startup parameter (PgBouncer refuses those it
// does not know) nor a session setting (a transaction pooler would hand it
// to other clients).
func (w *Waiter) regQuery(conn *pgx.Conn, sql, key string) error {
	ctx, cancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, key)
		return err
	})
}

// noListen reports (and remembers) a server without lease.listen: pg_lease
// before 0.3.0, which notifies every change anyway.
func (w *Waiter) noListen(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42883" {
		return false
	}
	w.mu.Lock()
	r := &w.regs
	r.unsupported = true
	for k, ch := range r.ready {
		close(ch)
		delete(r.ready, k)
	}
	w.mu.Unlock()
	w.event("listen_unsupported", err.Error())
	return true
}

func isPgError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}

// isTooManyRegistrations: lease.listen refused a new key because this
// session holds as many registrations as the server allows.
func isTooManyRegistrations(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "54000"
}

func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// connUp records that a connection listens again (before any registration),
// or that it was lost: then every registration is gone with its backend
// and the subscribers waiting for one are let go (the reconnection
// registers every wanted key before its resync event).
func (w *Waiter) connUp(up bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &w.regs
	r.up = up
	r.unsupported = false
	r.live = map[string]bool{}
	r.late = nil // the reconnection's resync event covers them
	r.all, r.covered = false, nil
	r.idle, r.nextDrop = nil, time.Time{}
	for k, ch := range r.ready {
		close(ch)
		delete(r.ready, k)
	}
	r.dirty = up && len(r.want) > 0
}

package listen

// The registry of lease.listen registrations: which keys some subscriber
// waits for, and which the server holds for the listen connection's backend.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/utils/clock"
)

// registry is the bookkeeping of lease.listen registrations (with
// pg_lease.notify = waiters, the default, a grant or release notifies only
// when some backend registered its key, or '*'). Every key a Watch
// subscription (and so every Await) waits for is registered on the listen
// connection before the subscription reads anything, and dropped
// registrationLinger after its last subscription ended. It has a lock of
// its own, never held while it calls the server or the fan-out; only the
// Waiter's connection goroutine calls sync.
type registry struct {
	clk     clock.PassiveClock
	timeout time.Duration // each registration call (QueryTimeout)
	emit    hook
	subs    *fanout // told to resync the subscribers of a key registered late

	mu    sync.Mutex
	want  map[string]int           // key ('*': every key) -> live subscriptions
	live  map[string]bool          // registered on the current connection
	ready map[string]chan struct{} // closed when the key is live (or the attempt ended)
	up    bool                     // a connection listens (registration is possible)
	dirty bool                     // want and live differ: the connection goroutine must sync
	kick  func()                   // interrupts the connection goroutine's wait for a notification
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

// registrationLinger is how long a key stays registered after its last
// subscription ended.
const registrationLinger = time.Second

// register counts a subscription to keys and returns the channels to wait
// on for the keys not yet registered on the current connection.
func (r *registry) register(keys []string) []chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// unregister ends a subscription to keys; a key nobody waits for any more
// is dropped from the server by the connection goroutine.
func (r *registry) unregister(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if r.want[k]--; r.want[k] <= 0 {
			delete(r.want, k)
			if r.live[k] {
				if r.idle == nil {
					r.idle = map[string]time.Time{}
				}
				r.idle[k] = r.clk.Now()
				r.dirty = true
			}
		}
	}
	if r.dirty && r.kick != nil {
		r.kick()
	}
}

// setKick installs (nil: removes) the interrupt of the connection
// goroutine's wait. It reports whether a sync is due already.
func (r *registry) setKick(kick func()) (dirty bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kick != nil && r.dirty {
		return true
	}
	r.kick = kick
	return r.dirty
}

// state reports whether a sync is due, the earliest pending drop, and
// whether a connection listens.
func (r *registry) state() (dirty bool, nextDrop time.Time, up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dirty, r.nextDrop, r.up
}

// registered reports whether the server may hold registrations of this
// backend (Close then drops them).
func (r *registry) registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return (len(r.live) > 0 || r.all) && !r.unsupported
}

// plan returns the keys to register and those to drop now, and forgets
// the dropped ones.
func (r *registry) plan() (add, drop []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = false
	if r.unsupported {
		return nil, nil
	}
	for k := range r.want {
		if !r.live[k] {
			add = append(add, k)
		}
	}
	r.nextDrop = time.Time{}
	now := r.clk.Now()
	stays := func(k string) bool {
		return r.want[k] > 0 || now.Before(r.idle[k].Add(registrationLinger))
	}
	// lease.unlisten('*') drops every registration of the backend: '*'
	// goes only when no other key stays, and never while it covers the
	// keys beyond the server's bound.
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
	return add, drop
}

// errKick ends a wait for a notification early: registrations changed.
var errKick = errors.New("listen: waiter: registrations changed")

// sync makes the server's registrations of this backend match the wanted
// keys: lease.listen for each new key, lease.unlisten for each key nobody
// waits for. Each call is its own transaction (call) on the listen
// connection, never inside a caller's transaction: listen's FOR SHARE lock
// on the key's row lasts microseconds, and lock_timeout (set in that
// transaction) bounds how long it waits behind a transaction that keeps the
// row locked (a holder renewing inside a long transaction); on that timeout
// the key stays pending and is tried again after the next notifications are
// dispatched, while its subscriber waits (at most QueryTimeout, then it
// reads and polls). It returns an error when the connection is lost.
func (r *registry) sync(ctx context.Context, conn *pgx.Conn) (retry bool, err error) {
	for {
		add, drop := r.plan()
		if len(add) == 0 && len(drop) == 0 {
			return retry, nil
		}
		// (drop happens only once the key's linger passed)
		for _, k := range drop {
			if err := r.call(ctx, conn, `SELECT lease.unlisten($1)`, k); err != nil {
				if r.noListen(err) {
					break
				}
				if !isPgError(err) {
					return false, err
				}
				r.emit.emit(sigUnlistenFailed, k+": "+err.Error())
				continue
			}
			r.emit.emit(sigUnlisten, k)
		}
		for _, k := range add {
			again, err := r.add(ctx, conn, k)
			if err != nil {
				return false, err
			}
			retry = retry || again
		}
		if retry {
			return true, nil
		}
	}
}

// add registers k. again: its row stayed locked; it is tried once more
// later.
func (r *registry) add(ctx context.Context, conn *pgx.Conn, k string) (again bool, err error) {
	r.mu.Lock()
	covered := r.all
	r.mu.Unlock()
	// Under '*' the server adds no row for k; the call still waits for a
	// change of k in flight.
	err = r.listen(ctx, conn, k)
	if isTooManyRegistrations(err) && k != "*" && !covered {
		// This session holds as many registrations as the server allows:
		// register '*' beside them, which covers every key.
		if err = r.listen(ctx, conn, "*"); err == nil {
			r.mu.Lock()
			r.all = true
			r.mu.Unlock()
			r.emit.emit(sigListenAll, k)
			covered = true
			err = r.listen(ctx, conn, k)
		}
	}
	switch {
	case err == nil:
		r.emit.emit(sigListen, k)
	case r.noListen(err):
	case isLockTimeout(err):
		// A transaction keeps the key's row locked: try again soon, after
		// dispatching what arrived meanwhile.
		r.emit.emit(sigListenLocked, k)
		r.mu.Lock()
		if r.late == nil {
			r.late = map[string]bool{}
		}
		r.late[k] = true
		r.mu.Unlock()
		return true, nil
	case !isPgError(err):
		return false, err
	default:
		// Refused (a standby, a read-only session, a key the server
		// rejects): the subscriber is not held; it reads and polls.
		r.emit.emit(sigListenFailed, k+": "+err.Error())
	}
	r.mu.Lock()
	late := r.late[k]
	delete(r.late, k)
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
	r.mu.Unlock()
	if late {
		r.subs.resync(k)
	}
	return false, nil
}

// listen registers key on conn: lease.listen, then once more after that
// commit. The second call waits for a change of the key that was in flight
// before the registration (pg_lease 0.4.0; a no-op before).
func (r *registry) listen(ctx context.Context, conn *pgx.Conn, key string) error {
	if err := r.call(ctx, conn, `SELECT lease.listen($1)`, key); err != nil {
		return err
	}
	return r.call(ctx, conn, `SELECT lease.listen($1)`, key)
}

// call runs a registration call in a transaction of its own under a short
// lock_timeout: lease.listen's lock on the key's row may wait behind a
// transaction that keeps it, and the waiter does not stall its notifications
// for long behind one (sync retries). The setting is local to the
// transaction: never a startup parameter (PgBouncer refuses those it does
// not know) nor a session setting (a transaction pooler would hand it to
// other clients).
func (r *registry) call(ctx context.Context, conn *pgx.Conn, sql, key string) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
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
func (r *registry) noListen(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42883" {
		return false
	}
	r.mu.Lock()
	r.unsupported = true
	r.releaseReadyLocked()
	r.mu.Unlock()
	r.emit.emit(sigListenUnsupported, err.Error())
	return true
}

// releaseReadyLocked lets go every Watch waiting for a registration.
func (r *registry) releaseReadyLocked() {
	for k, ch := range r.ready {
		close(ch)
		delete(r.ready, k)
	}
}

// connUp records that a connection listens again (before any registration),
// or that it was lost: then every registration is gone with its backend
// and the subscribers waiting for one are let go (the reconnection
// registers every wanted key before its resync event).
func (r *registry) connUp(up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.up = up
	r.unsupported = false
	r.live = map[string]bool{}
	r.late = nil // the reconnection's resync event covers them
	r.all, r.covered = false, nil
	r.idle, r.nextDrop = nil, time.Time{}
	r.releaseReadyLocked()
	r.dirty = up && len(r.want) > 0
}

// isUp reports whether a connection listens.
func (r *registry) isUp() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.up
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

// shutdown lets go every Watch waiting for a registration: the Waiter is
// closed.
func (r *registry) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.up = false
	r.releaseReadyLocked()
}

package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// channel is the NOTIFY channel on which pg_lease announces grants,
// releases and force-releases (not renewals, not lapses: expiry is lazy).
const channel = "pg_lease"

// WaiterOptions configure a Waiter. The zero value is ready to use.
type WaiterOptions struct {
	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// jitter) between attempts to re-establish the listen connection.
	// Zero: 50 ms and 5 s.
	ReconnectMin, ReconnectMax time.Duration
	// QueryTimeout bounds connecting and LISTEN on the listen connection,
	// and each read of a key by Await. Zero: 10 s.
	QueryTimeout time.Duration
	// WatchBuffer is the capacity of each Watch channel. Zero: 256.
	WatchBuffer int
	// ConnectInBackground makes NewWaiter return without a connection when
	// the server cannot be reached. The Waiter then connects when it can,
	// with the reconnection backoff. Until it listens, Await polls; once it
	// listens, every Watch subscriber gets an EventResync. A process that
	// starts during a database restart then waits instead of failing.
	ConnectInBackground bool
}

func (o *WaiterOptions) validate() error {
	def := func(name string, d *time.Duration, v time.Duration) error {
		switch {
		case *d == 0:
			*d = v
		case *d < 0:
			return fmt.Errorf("lease: WaiterOptions.%s: negative (%v)", name, *d)
		}
		return nil
	}
	if err := errors.Join(
		def("ReconnectMin", &o.ReconnectMin, 50*time.Millisecond),
		def("ReconnectMax", &o.ReconnectMax, 5*time.Second),
		def("QueryTimeout", &o.QueryTimeout, 10*time.Second),
	); err != nil {
		return err
	}
	if o.ReconnectMax < o.ReconnectMin {
		return fmt.Errorf("lease: WaiterOptions.ReconnectMax (%v) is below ReconnectMin (%v)", o.ReconnectMax, o.ReconnectMin)
	}
	switch {
	case o.WatchBuffer == 0:
		o.WatchBuffer = 256
	case o.WatchBuffer < 0:
		return fmt.Errorf("lease: WaiterOptions.WatchBuffer: negative (%d)", o.WatchBuffer)
	}
	return nil
}

// Event is a pg_lease notification (channel pg_lease), or a resync.
type Event struct {
	Type  EventType
	Key   string
	Owner string
	Epoch int64
	// Received is when this process read the notification.
	Received time.Time
}

// EventType is the kind of an Event: what pg_lease's NOTIFY payload names,
// or EventResync.
type EventType string

// The kinds of Event.
const (
	// EventAcquired: a grant.
	EventAcquired EventType = "acquired"
	// EventReleased: a release by the holder.
	EventReleased EventType = "released"
	// EventForceReleased: lease.force_release took the key from its holder.
	EventForceReleased EventType = "force_released"
	// EventResync is not a notification. Notifications may have been
	// missed: the listen connection was re-established, or the
	// subscriber's channel was full. Re-read the state you care about
	// (Client.List, Client.Inspect). A resync's Key is empty.
	EventResync EventType = "resync"
)

// Waiter is the process's one listener: it holds one dedicated connection
// (not from a pool: it must stay LISTENing), runs LISTEN pg_lease on it,
// re-establishes it after any loss, and fans the notifications out to Watch
// subscribers. Await, the one wake policy of the module, waits on it. See
// the package documentation.
type Waiter struct {
	cfg  *pgx.ConnConfig
	opts WaiterOptions

	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	loopDone chan struct{}

	mu       sync.Mutex
	closed   bool
	watchers map[*watcher]struct{}
	regs     registry
	seq      uint64                  // notifications and resyncs dispatched
	reads    map[readKey]*sharedRead // Await's reads in flight, shared

	hook func(kind, detail string) // tests: see export_test.go
}

type watcher struct {
	ch   chan Event
	keys map[string]bool // nil: every key
	lost bool            // an event was dropped: send a resync first
	stop func() bool     // context.AfterFunc's
}

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
}

// NewWaiter connects with cfg and returns a Waiter listening on channel
// pg_lease. cfg is copied (the caller may change it afterwards): pass
// pool.Config().ConnConfig to listen on a pool's database, or the result of
// pgx.ParseConfig(dsn). The connection always interrupts waits with
// deadlines (pgconn.DeadlineContextWatcherHandler), never with cancel
// requests, whatever cfg says. NewWaiter fails if the first connection
// cannot be made, unless opts.ConnectInBackground. Later losses of the
// connection are repaired in the background.
func NewWaiter(ctx context.Context, cfg *pgx.ConnConfig, opts WaiterOptions) (*Waiter, error) {
	return newWaiter(ctx, cfg, opts, nil)
}

func newWaiter(ctx context.Context, cfg *pgx.ConnConfig, opts WaiterOptions, hook func(kind, detail string)) (*Waiter, error) {
	if cfg == nil {
		return nil, errors.New("lease: NewWaiter: nil config")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.Copy()
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "pg_lease waiter"
	}
	// lease.listen's FOR SHARE lock waits behind a transaction that keeps
	// the key's row locked; the waiter does not stall its notifications for
	// long behind one (syncRegistrations retries).
	cfg.RuntimeParams["lock_timeout"] = "50ms"
	w := &Waiter{cfg: cfg, opts: opts, loopDone: make(chan struct{}), watchers: map[*watcher]struct{}{}, hook: hook}
	conn, err := w.connect(ctx)
	switch {
	case err == nil:
		w.regs.up = true // before run starts: a Watch from now on waits for its registration
	case opts.ConnectInBackground:
		w.event("connect_failed", err.Error()) // run connects
	default:
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	go w.run(conn)
	return w, nil
}

// Close stops the Waiter: Watch channels are closed (Await then polls), and
// the connection is closed. It waits for the background goroutine to end.
func (w *Waiter) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	<-w.loopDone
	return nil
}

// Watch subscribes to pg_lease notifications for keys (every key when none
// is given) until ctx ends or the Waiter is closed; then the channel is
// closed. Events come in the order the server committed them. A subscriber
// that does not keep up loses events and gets an EventResync before the next
// one it receives; so does every subscriber after the listen connection was
// re-established. Notifications sent with pg_lease.notify = off, or through
// a proxy that drops LISTEN, never arrive.
//
// Watch registers its keys ('*' when none is given) with lease.listen on the
// listen connection and returns once the server holds the registrations (or
// the connection is down, or ctx ends, or QueryTimeout passed while a
// transaction kept the key's row locked: then the registration completes in
// the background and an EventResync follows), so
// that with pg_lease.notify = waiters every change committed after Watch
// returns is notified. The registrations are dropped (lease.unlisten) a
// second (registrationLinger) after the last subscription of a key ends,
// and all of them at Close.
func (w *Waiter) Watch(ctx context.Context, keys ...string) <-chan Event {
	wt := &watcher{ch: make(chan Event, w.opts.WatchBuffer)}
	regKeys := []string{"*"}
	if len(keys) > 0 {
		wt.keys = map[string]bool{}
		regKeys = regKeys[:0]
		for _, k := range keys {
			if !wt.keys[k] {
				regKeys = append(regKeys, k)
			}
			wt.keys[k] = true
		}
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		close(wt.ch)
		return wt.ch
	}
	w.watchers[wt] = struct{}{}
	pending := w.registerLocked(regKeys)
	wt.stop = context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.watchers[wt]; ok {
			delete(w.watchers, wt)
			close(wt.ch)
			w.unregisterLocked(regKeys)
		}
	})
	w.mu.Unlock()
	if len(pending) > 0 {
		t := time.NewTimer(w.opts.QueryTimeout)
		defer t.Stop()
		for _, ch := range pending {
			select {
			case <-ch:
			case <-ctx.Done():
				return wt.ch
			case <-t.C:
				w.event("register_slow", "")
				return wt.ch
			}
		}
	}
	return wt.ch
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
var errKick = errors.New("lease: waiter: registrations changed")

// syncRegistrations makes the server's registrations of this backend match
// the wanted keys: lease.listen for each new key, lease.unlisten for each key
// nobody waits for. Each call is its own transaction (autocommit) on the
// listen connection, never inside a caller's transaction: listen's FOR SHARE
// lock on the key's row lasts microseconds, and lock_timeout (set on this
// connection) bounds how long it waits behind a transaction that keeps the
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
			for k := range r.live {
				if r.want[k] > 0 {
					continue
				}
				if at := r.idle[k].Add(registrationLinger); now.Before(at) {
					if r.nextDrop.IsZero() || at.Before(r.nextDrop) {
						r.nextDrop = at
					}
					continue
				}
				drop = append(drop, k)
				delete(r.live, k) // a new subscriber waits for the next listen
				delete(r.idle, k)
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
			err := w.regQuery(conn, `SELECT lease.listen($1)`, k)
			if err == nil {
				// Once more, now that the registration is committed: this call
				// waits for a change of the key that was in flight before it
				// (pg_lease 0.4.0; a no-op before).
				err = w.regQuery(conn, `SELECT lease.listen($1)`, k)
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

func (w *Waiter) regQuery(conn *pgx.Conn, sql, key string) error {
	ctx, cancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, sql, key)
	return err
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
	r.idle, r.nextDrop = nil, time.Time{}
	for k, ch := range r.ready {
		close(ch)
		delete(r.ready, k)
	}
	r.dirty = up && len(r.want) > 0
}

// Await is the module's one wake policy for code that waits on a key (an
// elector's follower, a resourcelock follower's Get, the CLI's watch): it
// reads key through c (Inspect) and returns the first state for which done
// is true, reading again only when the key may have changed:
//
//   - a notification for key (a grant, a release, a force-release) or a
//     EventResync (the listen connection came back: notifications may have
//     been missed), from w;
//   - the observed grant's expiry on the local clock (State.ExpiresLocal:
//     never early), because a lapse sends no notification;
//   - poll after the last read, which bounds how late a change is seen when
//     no notification can arrive (w nil or closed, the listen connection
//     down, pg_lease.notify = off on the writer, a transaction-pooling proxy
//     in between).
//
// It subscribes (Watch: registering key with lease.listen) before the first
// read, so a change committed after that read always wakes it, whatever
// pg_lease.notify says (except off). Each read is bounded by the Waiter's QueryTimeout
// (10 s without a Waiter), so a silently dead connection cannot stall it. It
// returns the read's error, or ctx's cause when ctx ends. w may be nil
// (polling only). Timers run on c's clock.
func (w *Waiter) Await(ctx context.Context, c *Client, key string, poll time.Duration, done func(State) bool) (State, error) {
	if poll <= 0 {
		return State{}, fmt.Errorf("lease: Await %q: %w: poll must be positive, got %v", key, ErrInvalidInput, poll)
	}
	var events <-chan Event
	callTimeout := 10 * time.Second
	if w != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events = w.Watch(wctx, key)
		callTimeout = w.opts.QueryTimeout
	}
	clk := c.clock
	var after uint64 // the events dispatched when this Await woke
	shared := false  // woken by an event: a read begun since then will do
	for {
		var (
			st  State
			err error
		)
		if shared {
			st, err = w.sharedInspect(ctx, c, key, after, callTimeout)
		} else {
			ictx, cancel := context.WithTimeout(ctx, callTimeout)
			st, err = c.Inspect(ictx, key)
			cancel()
		}
		shared = false
		if err != nil {
			if ctx.Err() != nil {
				return State{}, fmt.Errorf("lease: await %q: %w", key, context.Cause(ctx))
			}
			return State{}, err
		}
		if done(st) {
			return st, nil
		}
		wake := poll
		if at := st.ExpiresLocal(); !at.IsZero() {
			wake = min(wake, max(at.Sub(clk.Now()), 0))
		}
		timer := clk.NewTimer(wake)
		select {
		case <-ctx.Done():
			timer.Stop()
			return State{}, fmt.Errorf("lease: await %q: %w", key, context.Cause(ctx))
		case _, ok := <-events:
			if !ok {
				events = nil // the Waiter was closed: poll from now on
			} else {
				after, shared = w.dispatched(), true
			}
		case <-timer.C():
		}
		timer.Stop()
	}
}

// readKey names the reads Awaits of one Waiter may share.
type readKey struct {
	c   *Client
	key string
}

// sharedRead is one Inspect of a key that the Awaits woken by the same
// notification share: a herd of followers of one key in one process costs
// one read per notification, not one per follower.
type sharedRead struct {
	seq  uint64 // events dispatched when the read began
	done chan struct{}
	st   State
	err  error
}

// dispatched is the number of notifications and resyncs dispatched so far.
func (w *Waiter) dispatched() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

// sharedInspect reads key through c, joining a read of the same key and
// client that began after the first after events were dispatched (and so
// after the change that woke the caller committed), or starting one. The
// read runs to its end (bounded by timeout) even if the caller stops
// waiting, for the others.
func (w *Waiter) sharedInspect(ctx context.Context, c *Client, key string, after uint64, timeout time.Duration) (State, error) {
	k := readKey{c, key}
	w.mu.Lock()
	r := w.reads[k]
	joined := r != nil && r.seq >= after
	if !joined {
		r = &sharedRead{seq: w.seq, done: make(chan struct{})}
		if w.reads == nil {
			w.reads = map[readKey]*sharedRead{}
		}
		w.reads[k] = r
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		go func() {
			defer cancel()
			r.st, r.err = c.Inspect(rctx, key)
			w.mu.Lock()
			if w.reads[k] == r {
				delete(w.reads, k)
			}
			w.mu.Unlock()
			close(r.done)
		}()
	}
	w.mu.Unlock()
	if joined {
		w.event("read_shared", key)
	}
	select {
	case <-r.done:
		return r.st, r.err
	case <-ctx.Done():
		return State{}, ctx.Err()
	}
}

func (w *Waiter) event(kind, detail string) {
	if w.hook != nil {
		w.hook(kind, detail)
	}
}

// connect opens the connection and LISTENs.
func (w *Waiter) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return nil, fmt.Errorf("lease: waiter: connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("lease: waiter: LISTEN %s: %w", channel, err)
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
			registered := len(w.regs.live) > 0 && !w.regs.unsupported
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
				}
				continue
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

// keepalive is how long the connection may stay silent before the waiter
// checks it with a query: a connection that died without a word (a dropped
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
	n, err := conn.WaitForNotification(wctx)
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

// shutdown closes every Watch channel.
func (w *Waiter) shutdown() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.regs.up = false
	for k, ch := range w.regs.ready { // a Watch waiting for a registration returns
		close(ch)
		delete(w.regs.ready, k)
	}
	for wt := range w.watchers {
		wt.stop()
		delete(w.watchers, wt)
		close(wt.ch)
	}
}

// resync tells every subscriber that notifications may have been lost
// while no connection listened.
func (w *Waiter) resync() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	now := time.Now()
	for wt := range w.watchers {
		wt.lost = true
		flushLocked(wt, now)
	}
}

// resyncKeyLocked sends a resync event to the subscribers of key.
func (w *Waiter) resyncKeyLocked(key string) {
	w.seq++
	now := time.Now()
	for wt := range w.watchers {
		if key == "*" || wt.keys == nil || wt.keys[key] {
			wt.lost = true
			flushLocked(wt, now)
		}
	}
}

type payload struct {
	Event string `json:"event"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
}

func (w *Waiter) notified(n *pgconn.Notification) {
	now := time.Now()
	if n.Channel != channel {
		return
	}
	var p payload
	if err := json.Unmarshal([]byte(n.Payload), &p); err != nil || p.Key == "" {
		w.event("bad_payload", n.Payload)
		return
	}
	ev := Event{Type: EventType(p.Event), Key: p.Key, Owner: p.Owner, Epoch: p.Epoch, Received: now}
	w.event("notified", p.Key)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	for wt := range w.watchers {
		if wt.keys != nil && !wt.keys[p.Key] {
			continue
		}
		flushLocked(wt, now)
		if wt.lost {
			continue
		}
		select {
		case wt.ch <- ev:
		default:
			wt.lost = true
		}
	}
}

// flushLocked sends a pending resync event if there is room.
func flushLocked(wt *watcher, now time.Time) {
	if !wt.lost {
		return
	}
	select {
	case wt.ch <- Event{Type: EventResync, Received: now}:
		wt.lost = false
	default:
	}
}

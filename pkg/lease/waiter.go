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

// Channel is the NOTIFY channel on which pg_lease announces every change of
// a lease.
const Channel = "pg_lease"

// WaiterOptions configure a Waiter. The zero value is ready to use; see
// doc.go for what each knob trades.
type WaiterOptions struct {
	// FallbackPoll is how often each waiting Acquire tries again when
	// nothing woke it: the bound on A2 when notifications cannot arrive (a
	// transaction-pooling proxy, pg_lease.notify = off on the releaser).
	// Zero: 1 s. Negative: no fallback poll (a release that sends no
	// notification is then seen only at the released grant's old expiry).
	FallbackPoll time.Duration
	// ClockRefresh is how often the server clock's offset is re-measured.
	// Zero: 1 minute.
	ClockRefresh time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// jitter) between attempts to re-establish the listen connection.
	// Zero: 50 ms and 5 s.
	ReconnectMin, ReconnectMax time.Duration
	// QueryTimeout bounds each query on the connection; a query that
	// exceeds it closes the connection, which is then re-established.
	// Zero: 10 s.
	QueryTimeout time.Duration
	// WatchBuffer is the capacity of each Watch channel. Zero: 256.
	WatchBuffer int
}

func (o *WaiterOptions) validate() error {
	def := func(name string, d *time.Duration, v time.Duration, allowNeg bool) error {
		switch {
		case *d == 0:
			*d = v
		case *d < 0 && !allowNeg:
			return fmt.Errorf("lease: WaiterOptions.%s: negative (%v)", name, *d)
		}
		return nil
	}
	for _, e := range []error{
		def("FallbackPoll", &o.FallbackPoll, time.Second, true),
		def("ClockRefresh", &o.ClockRefresh, time.Minute, false),
		def("ReconnectMin", &o.ReconnectMin, 50*time.Millisecond, false),
		def("ReconnectMax", &o.ReconnectMax, 5*time.Second, false),
		def("QueryTimeout", &o.QueryTimeout, 10*time.Second, false),
	} {
		if e != nil {
			return e
		}
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

// EventType is the kind of a pg_lease notification.
type EventType string

const (
	EventAcquired      EventType = "acquired"
	EventReleased      EventType = "released"
	EventForceReleased EventType = "force_released"
	// EventResync is not a notification: it says that notifications may
	// have been missed (the listen connection was re-established, or the
	// subscriber's channel was full) and that the subscriber should re-read
	// the state it cares about (Client.List, Client.Inspect). Its Key is
	// empty.
	EventResync EventType = "resync"
)

// Event is a pg_lease notification (channel pg_lease), or EventResync.
type Event struct {
	Type  EventType
	Key   string
	Owner string
	Epoch int64
	// Received is when this process read the notification.
	Received time.Time
}

// WaiterStats counts what a Waiter did, for tests, benchmarks and metrics.
type WaiterStats struct {
	Notifications int64 // notifications read on the listen connection
	Attempts      int64 // acquire attempts sent
	WakesNotify   int64 // attempts due to a release notification
	WakesExpiry   int64 // attempts due to the holder's grant expiring
	WakesPoll     int64 // attempts due to the fallback poll
	Connects      int64 // listen connections established (the first included)
	ConnLost      int64 // listen connections lost
}

// Waiter waits for keys without blind polling. It holds one dedicated
// connection, LISTENs on channel pg_lease, and runs every acquire attempt of
// every waiting goroutine on that connection, from one goroutine. See the
// package documentation for its states and wake-ups.
type Waiter struct {
	cfg  *pgx.ConnConfig
	opts WaiterOptions

	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	loopDone chan struct{}

	mu        sync.Mutex
	closed    bool
	seq       uint64
	waiting   []*waitReq // registration order (fair per key)
	watchers  map[*watcher]struct{}
	interrupt context.CancelFunc // ends the current WaitForNotification
	kick      bool               // work arrived since the loop last looked
	clock     ClockOffset
	stats     WaiterStats

	hook func(kind, key string) // tests: see export_test.go
}

type waitReq struct {
	key, owner string
	ttl        time.Duration
	seq        uint64

	// Guarded by Waiter.mu.
	wakeAt    time.Time // zero: due now
	reason    wakeReason
	freeSeen  int // consecutive denials after which the key was found free
	cancelled bool
	completed bool
	done      chan acquireResult // buffered 1
}

type wakeReason int

const (
	wakeFirst wakeReason = iota
	wakeNotify
	wakeExpiry
	wakePoll
	wakeReconnect
	wakeRetry
)

func (r wakeReason) String() string {
	return [...]string{"first", "notify", "expiry", "poll", "reconnect", "retry"}[r]
}

type acquireResult struct {
	g   Grant
	err error
}

type watcher struct {
	ch   chan Event
	keys map[string]bool // nil: every key
	lost bool            // an event was dropped: send EventResync first
	stop func() bool     // context.AfterFunc's
}

// NewWaiter connects to connString (a libpq DSN or URL) and returns a Waiter
// listening on channel pg_lease. It fails if the first connection cannot be
// made; later losses of the connection are repaired in the background.
func NewWaiter(ctx context.Context, connString string, opts WaiterOptions) (*Waiter, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("lease: NewWaiter: %w", err)
	}
	return NewWaiterConfig(ctx, cfg, opts)
}

// NewWaiterConfig is NewWaiter from a parsed configuration (copied: the
// caller may change cfg afterwards). The connection always interrupts waits
// with deadlines (pgconn.DeadlineContextWatcherHandler), never with cancel
// requests, whatever cfg says: interrupting a wait must not cancel the
// query that follows.
func NewWaiterConfig(ctx context.Context, cfg *pgx.ConnConfig, opts WaiterOptions) (*Waiter, error) {
	return newWaiter(ctx, cfg, opts, nil)
}

func newWaiter(ctx context.Context, cfg *pgx.ConnConfig, opts WaiterOptions, hook func(kind, key string)) (*Waiter, error) {
	if cfg == nil {
		return nil, errors.New("lease: NewWaiterConfig: nil config")
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
	w := &Waiter{cfg: cfg, opts: opts, loopDone: make(chan struct{}), watchers: map[*watcher]struct{}{}, hook: hook}
	conn, err := w.connect(ctx)
	if err != nil {
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	go w.run(conn)
	return w, nil
}

// Close stops the Waiter: waiting Acquire calls return ErrWaiterClosed,
// Watch channels are closed, and the connection is closed. It waits for the
// background goroutine to end.
func (w *Waiter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.loopDone
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	<-w.loopDone
	return nil
}

// ClockOffset is the last measurement of the server clock's offset.
func (w *Waiter) ClockOffset() ClockOffset {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.clock
}

// Stats returns the counters so far.
func (w *Waiter) Stats() WaiterStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Acquire blocks until owner holds key (for ttl from the grant) or ctx
// ends. It tries at once, then again whenever the key may have become free:
// on a release or force_release notification for key, at the current grant's
// expiry (on the local clock, through the measured server-clock offset), on
// the fallback poll, and after the listen connection was re-established.
//
// A server error other than "held by another owner" (ErrInvalidInput,
// ErrNotInstalled, ...) ends the wait with that error; losing the connection
// does not. When ctx ends it returns ctx's error, and a grant obtained in
// that instant is released; if the grant was already handed over when ctx
// ended, Acquire returns it.
func (w *Waiter) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (Grant, error) {
	if err := checkTTL("acquire", Token{Key: key, Owner: owner}, "ttl", ttl, false); err != nil {
		return Grant{}, err
	}
	r := &waitReq{key: key, owner: owner, ttl: ttl, done: make(chan acquireResult, 1)}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return Grant{}, fmt.Errorf("lease: acquire %q: %w", key, ErrWaiterClosed)
	}
	w.seq++
	r.seq = w.seq
	w.waiting = append(w.waiting, r)
	w.kickLocked()
	w.mu.Unlock()

	select {
	case res := <-r.done:
		return res.g, res.err
	case <-ctx.Done():
	}
	w.mu.Lock()
	if r.completed {
		w.mu.Unlock()
		res := <-r.done
		return res.g, res.err
	}
	r.cancelled = true
	w.removeLocked(r)
	w.mu.Unlock()
	return Grant{}, fmt.Errorf("lease: acquire %q: waiting: %w", key, context.Cause(ctx))
}

// Watch subscribes to pg_lease notifications for keys (every key when none
// is given) until ctx ends or the Waiter is closed; then the channel is
// closed. Events come in the order the server committed them. A subscriber
// that does not keep up loses events and gets an EventResync before the next
// one it receives; so does every subscriber after the listen connection was
// re-established. Notifications sent with pg_lease.notify = off, or through
// a proxy that drops LISTEN, never arrive.
func (w *Waiter) Watch(ctx context.Context, keys ...string) <-chan Event {
	wt := &watcher{ch: make(chan Event, w.opts.WatchBuffer)}
	if len(keys) > 0 {
		wt.keys = map[string]bool{}
		for _, k := range keys {
			wt.keys[k] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		close(wt.ch)
		return wt.ch
	}
	w.watchers[wt] = struct{}{}
	wt.stop = context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.watchers[wt]; ok {
			delete(w.watchers, wt)
			close(wt.ch)
		}
	})
	return wt.ch
}

// ---------------------------------------------------------------------------
// The loop: one goroutine owns the connection.
// ---------------------------------------------------------------------------

func (w *Waiter) kickLocked() {
	w.kick = true
	if w.interrupt != nil {
		w.interrupt()
		w.interrupt = nil
	}
}

func (w *Waiter) removeLocked(r *waitReq) {
	for i, x := range w.waiting {
		if x == r {
			w.waiting = append(w.waiting[:i], w.waiting[i+1:]...)
			return
		}
	}
}

func (w *Waiter) completeLocked(r *waitReq, res acquireResult) {
	r.completed = true
	w.removeLocked(r)
	r.done <- res
}

func (w *Waiter) event(kind, key string) {
	if w.hook != nil {
		w.hook(kind, key)
	}
}

// connect opens the connection, LISTENs and measures the clock.
func (w *Waiter) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return nil, fmt.Errorf("lease: waiter: connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+Channel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("lease: waiter: LISTEN %s: %w", Channel, err)
	}
	off, err := MeasureClockOffset(ctx, conn, 3)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("lease: waiter: %w", err)
	}
	w.mu.Lock()
	w.clock = off
	w.stats.Connects++
	w.mu.Unlock()
	return conn, nil
}

func (w *Waiter) run(conn *pgx.Conn) {
	defer close(w.loopDone)
	defer func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
		}
		w.shutdown()
	}()
	w.event("listening", "")
	backoff := w.opts.ReconnectMin
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
			w.reconnected()
			w.event("listening", "")
		}
		if err := w.step(conn); err != nil {
			if w.ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.stats.ConnLost++
			w.mu.Unlock()
			w.event("conn_lost", err.Error())
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
		}
	}
}

// shutdown answers every waiting Acquire and closes every Watch channel.
func (w *Waiter) shutdown() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for len(w.waiting) > 0 {
		r := w.waiting[0]
		w.completeLocked(r, acquireResult{err: fmt.Errorf("lease: acquire %q: %w", r.key, ErrWaiterClosed)})
	}
	for wt := range w.watchers {
		wt.stop()
		delete(w.watchers, wt)
		close(wt.ch)
	}
}

// reconnected makes every waiting key due (notifications may have been
// lost while no connection listened) and tells every subscriber.
func (w *Waiter) reconnected() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.waiting {
		r.wakeAt, r.reason = time.Time{}, wakeReconnect
	}
	now := time.Now()
	for wt := range w.watchers {
		wt.lost = true
		w.flushLocked(wt, now)
	}
}

// step runs the due attempts, then waits for a notification until the next
// wake-up. It returns an error only when the connection is lost.
func (w *Waiter) step(conn *pgx.Conn) error {
	if err := w.refreshClock(conn); err != nil {
		return err
	}
	if err := w.attemptDue(conn); err != nil {
		return err
	}

	w.mu.Lock()
	if w.kick {
		w.kick = false
		w.mu.Unlock()
		return nil
	}
	next := w.clock.Local.Add(w.opts.ClockRefresh)
	for _, r := range w.waiting {
		if r.wakeAt.Before(next) {
			next = r.wakeAt
		}
	}
	wctx, cancel := context.WithDeadline(w.ctx, next)
	defer cancel()
	w.interrupt = cancel
	w.mu.Unlock()

	n, err := conn.WaitForNotification(wctx)

	w.mu.Lock()
	w.interrupt = nil
	w.kick = false
	w.mu.Unlock()
	if n != nil {
		w.notified(n)
	}
	if err != nil && conn.IsClosed() {
		return err
	}
	return nil
}

func (w *Waiter) refreshClock(conn *pgx.Conn) error {
	w.mu.Lock()
	due := time.Since(w.clock.Local) >= w.opts.ClockRefresh
	w.mu.Unlock()
	if !due {
		return nil
	}
	ctx, cancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer cancel()
	off, err := MeasureClockOffset(ctx, conn, 3)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.clock = off
	w.mu.Unlock()
	return nil
}

type payload struct {
	Event string `json:"event"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
}

func (w *Waiter) notified(n *pgconn.Notification) {
	now := time.Now()
	if n.Channel != Channel {
		return
	}
	var p payload
	if err := json.Unmarshal([]byte(n.Payload), &p); err != nil || p.Key == "" {
		w.event("bad_payload", n.Payload)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stats.Notifications++
	if p.Event == string(EventReleased) || p.Event == string(EventForceReleased) {
		for _, r := range w.waiting {
			if r.key == p.Key {
				r.wakeAt, r.reason = time.Time{}, wakeNotify
			}
		}
	}
	ev := Event{Type: EventType(p.Event), Key: p.Key, Owner: p.Owner, Epoch: p.Epoch, Received: now}
	for wt := range w.watchers {
		if wt.keys != nil && !wt.keys[p.Key] {
			continue
		}
		w.flushLocked(wt, now)
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

// flushLocked sends a pending EventResync if there is room.
func (w *Waiter) flushLocked(wt *watcher, now time.Time) {
	if !wt.lost {
		return
	}
	select {
	case wt.ch <- Event{Type: EventResync, Received: now}:
		wt.lost = false
	default:
	}
}

// attemptDue tries every waiting request whose wake-up has come, in
// registration order.
func (w *Waiter) attemptDue(conn *pgx.Conn) error {
	now := time.Now()
	w.mu.Lock()
	var due []*waitReq
	for _, r := range w.waiting {
		if !r.wakeAt.After(now) {
			due = append(due, r)
		}
	}
	w.mu.Unlock()
	for _, r := range due {
		if err := w.attempt(conn, r); err != nil {
			return err
		}
	}
	return nil
}

// connLost tells a lost connection from a server's answer.
func connLost(conn *pgx.Conn, err error) bool {
	var pg *pgconn.PgError
	return conn.IsClosed() || !errors.As(err, &pg)
}

func (w *Waiter) attempt(conn *pgx.Conn, r *waitReq) error {
	w.mu.Lock()
	if r.cancelled || r.completed {
		w.mu.Unlock()
		return nil
	}
	reason := r.reason
	w.stats.Attempts++
	switch reason {
	case wakeNotify:
		w.stats.WakesNotify++
	case wakeExpiry:
		w.stats.WakesExpiry++
	case wakePoll:
		w.stats.WakesPoll++
	}
	w.mu.Unlock()
	w.event("attempt:"+reason.String(), r.key)

	ctx, cancel := context.WithTimeout(w.ctx, w.opts.QueryTimeout)
	defer cancel()
	c := New(conn)
	g, ok, err := c.Acquire(ctx, r.key, r.owner, r.ttl)
	if err != nil {
		if connLost(conn, err) {
			return err
		}
		w.mu.Lock()
		if !r.cancelled {
			w.completeLocked(r, acquireResult{err: err})
		}
		w.mu.Unlock()
		return nil
	}
	if ok {
		w.mu.Lock()
		if !r.cancelled {
			w.completeLocked(r, acquireResult{g: g})
			w.mu.Unlock()
			w.event("granted", r.key)
			return nil
		}
		w.mu.Unlock()
		// The caller gave up in the meantime: do not leave the grant held.
		if err := c.Release(ctx, g.Token); err != nil && connLost(conn, err) {
			return err
		}
		return nil
	}

	// Denied: learn the holder's expiry to wake at it.
	sent := time.Now()
	st, err := c.Inspect(ctx, r.key)
	recv := time.Now()
	if err != nil {
		if connLost(conn, err) {
			return err
		}
		w.mu.Lock()
		if !r.cancelled {
			w.completeLocked(r, acquireResult{err: err})
		}
		w.mu.Unlock()
		return nil
	}
	w.mu.Lock()
	if r.cancelled {
		w.mu.Unlock()
		return nil
	}
	var (
		wake time.Time
		why  wakeReason
	)
	switch {
	case !st.Held && r.freeSeen < 3:
		// Freed between the acquire and the inspect: try again at once (a
		// bounded number of times, in case other owners keep winning).
		r.freeSeen++
		why = wakeRetry
	case !st.Held:
		// Keeps changing hands: leave it to notifications and the poll.
		wake, why = recv.Add(24*time.Hour), wakePoll
	default:
		r.freeSeen = 0
		wake, why = w.expiryWakeLocked(st.ExpiresAt, st.ServerNow, sent, recv), wakeExpiry
	}
	if !wake.IsZero() && w.opts.FallbackPoll > 0 {
		if p := recv.Add(w.opts.FallbackPoll); p.Before(wake) {
			wake, why = p, wakePoll
		}
	}
	r.wakeAt, r.reason = wake, why
	w.mu.Unlock()
	w.event("denied", r.key)
	return nil
}

// expiryWakeLocked converts the holder's expiry to the local instant at
// which to try again. The measured offset gives the best estimate; the
// inspect's own round trip bounds it: the server read serverNow between
// sent and recv, so the expiry is locally within [sent+left, recv+left].
// An estimate outside that interval (a stale offset), or one that has
// already passed (we woke a little early), is replaced by recv+left, which
// is never early.
func (w *Waiter) expiryWakeLocked(expires, serverNow, sent, recv time.Time) time.Time {
	left := expires.Sub(serverNow)
	lo, hi := sent.Add(left), recv.Add(left)
	est := w.clock.ToLocal(expires)
	if est.Before(lo) || est.After(hi) {
		return hi
	}
	return est
}

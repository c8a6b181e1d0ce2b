package listen

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pglease/pg_lease/pkg/lease"
	"k8s.io/utils/clock"
)

// Options configure a Waiter. The zero value is ready to use.
type Options struct {
	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// jitter) between attempts to re-establish the listen connection. A
	// read by Await that reaches the server ends the backoff: the Waiter
	// connects at once. Zero: 50 ms and 5 s.
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
	// Clock is the clock the Waiter reads and arms its timers on (the
	// reconnection backoff, the registrations' linger, the keepalive).
	// Nil: the real clock. Await and the other waits run on their
	// lease.Client's clock.
	Clock clock.WithTicker
}

// withDefaults returns o with every zero field set to its default, and
// validates the result. Each error names the field and matches
// lease.ErrInvalidInput.
func (o Options) withDefaults() (Options, error) {
	def := func(name string, d *time.Duration, v time.Duration) error {
		switch {
		case *d == 0:
			*d = v
		case *d < 0:
			return fmt.Errorf("%w: listen.Options.%s: negative (%v)", lease.ErrInvalidInput, name, *d)
		}
		return nil
	}
	if err := errors.Join(
		def("ReconnectMin", &o.ReconnectMin, 50*time.Millisecond),
		def("ReconnectMax", &o.ReconnectMax, 5*time.Second),
		def("QueryTimeout", &o.QueryTimeout, 10*time.Second),
	); err != nil {
		return o, err
	}
	if o.ReconnectMax < o.ReconnectMin {
		return o, fmt.Errorf("%w: listen.Options.ReconnectMax (%v) is below ReconnectMin (%v)", lease.ErrInvalidInput, o.ReconnectMax, o.ReconnectMin)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	switch {
	case o.WatchBuffer == 0:
		o.WatchBuffer = 256
	case o.WatchBuffer < 0:
		return o, fmt.Errorf("%w: listen.Options.WatchBuffer: negative (%d)", lease.ErrInvalidInput, o.WatchBuffer)
	}
	return o, nil
}

// Event is a pg_lease notification (channel pg_lease), or a resync. Any
// role may NOTIFY pg_lease: Type, Owner and Epoch are what the payload
// says, not what happened. Take an event as a sign that Key may have
// changed, and read the key (Inspect, List, Await) before acting on it.
type Event struct {
	Type  EventType
	Key   string
	Owner string
	Epoch int64
	// Received is when this process read the notification.
	Received time.Time

	seq uint64 // notifications dispatched when it was (Changes only)
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
	// EventHandover: a release granted the key to the candidate its
	// strategy chose, in the release's transaction; Owner and Epoch name
	// the new grant.
	EventHandover EventType = "handover"
	// EventResync is not a notification. Notifications may have been
	// missed: the listen connection was re-established, or the
	// subscriber's channel was full. Re-read the state you care about
	// (lease.Client.List, lease.Client.Inspect). A resync's Key is empty.
	EventResync EventType = "resync"
)

// Waiter is the process's one listener. It holds one dedicated connection,
// not one from a pool, because it must stay LISTENing. It runs LISTEN
// pg_lease there and makes the connection again after any loss. It fans
// the notifications out to Watch subscribers. Await, the module's one wake
// policy, waits on it. See the package documentation.
type Waiter struct {
	cfg  *pgx.ConnConfig
	opts Options
	clk  clock.WithTicker
	emit hook // tests: see export_test.go

	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	loopDone chan struct{}
	// reachedC ends the reconnection backoff: a read through a lease.Client
	// just reached the server (reached).
	reachedC chan struct{}

	subs     fanout      // the Watch subscriptions (their own lock)
	regs     registry    // the lease.listen registrations (their own lock)
	reads    sharedReads // Await's reads in flight (their own lock)
	acquires sharedAcquires

	waiting atomic.Bool // the connection waits for notifications (interrupter)
}

// NewWaiter connects with cfg and returns a Waiter listening on channel
// pg_lease. cfg is copied, so the caller may change it afterwards. Pass
// pool.Config().ConnConfig to listen on a pool's database, or the result of
// pgx.ParseConfig(dsn). Whatever cfg says, a wait for notifications ends
// by a deadline on the socket, and a query whose context ended gets
// QueryTimeout more to finish before pgx interrupts it (and sends a cancel
// request). NewWaiter fails if the first connection cannot be made, unless
// opts.ConnectInBackground. Later losses of the connection are repaired in
// the background.
func NewWaiter(ctx context.Context, cfg *pgx.ConnConfig, opts Options) (*Waiter, error) {
	return newWaiter(ctx, cfg, opts, nil)
}

func newWaiter(ctx context.Context, cfg *pgx.ConnConfig, opts Options, h hook) (*Waiter, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: NewWaiter: nil config", lease.ErrInvalidInput)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = cfg.Copy()
	w := &Waiter{opts: opts, clk: opts.Clock, emit: h, loopDone: make(chan struct{}), reachedC: make(chan struct{}, 1)}
	w.subs.clk = w.clk
	w.regs = registry{clk: w.clk, timeout: opts.QueryTimeout, emit: h, subs: &w.subs}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &interrupter{conn: c.Conn(), waiting: &w.waiting, delay: opts.QueryTimeout}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "pg_lease waiter"
	}
	w.cfg = cfg
	conn, err := w.connect(ctx)
	switch {
	case err == nil:
		w.regs.up = true // before run starts: a Watch from now on waits for its registration
	case opts.ConnectInBackground:
		w.emit.emit(sigConnectFailed, err.Error()) // run connects
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
	w.subs.close()
	w.cancel()
	<-w.loopDone
	return nil
}

// Watch subscribes to pg_lease notifications for keys, or for every key
// when none is given. The channel is closed when ctx ends or the Waiter is
// closed. Events come in the order the server committed them. A subscriber
// that does not keep up loses events, and gets an EventResync before the
// next one it receives. So does every subscriber after the listen
// connection was made again. Notifications sent with pg_lease.notify = off,
// or through a proxy that drops LISTEN, never arrive.
//
// Watch registers its keys ('*' when none is given) with lease.listen on the
// listen connection. It returns once the server holds the registrations, so
// that with pg_lease.notify = waiters every change committed after Watch
// returns is notified. It also returns when the connection is down, when ctx
// ends, or after QueryTimeout. In the last case the registration completes
// in the background and an EventResync follows. The registrations are
// dropped (lease.unlisten) a second (registrationLinger) after the last
// subscription of a key ends, and all of them at Close.
func (w *Waiter) Watch(ctx context.Context, keys ...string) <-chan Event {
	return w.watch(ctx, false, keys)
}

// watch is Watch; seqs: the events carry their dispatch count.
func (w *Waiter) watch(ctx context.Context, seqs bool, keys []string) <-chan Event {
	wt := &watcher{ch: make(chan Event, w.opts.WatchBuffer), seqs: seqs, stop: func() bool { return false }}
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
	if !w.subs.add(wt) {
		close(wt.ch)
		return wt.ch
	}
	pending := w.regs.register(regKeys)
	stop := context.AfterFunc(ctx, func() {
		if w.subs.remove(wt) {
			w.regs.unregister(regKeys)
		}
	})
	w.subs.setStop(wt, stop)
	if len(pending) == 0 {
		return wt.ch
	}
	t := w.clk.NewTimer(w.opts.QueryTimeout)
	defer t.Stop()
	for _, ch := range pending {
		select {
		case <-ch:
		case <-ctx.Done():
			return wt.ch
		case <-t.C():
			w.emit.emit(sigRegisterSlow, "")
			return wt.ch
		}
	}
	return wt.ch
}

// queryTimeout bounds each read of a wait (10 s without a Waiter).
func (w *Waiter) queryTimeout() time.Duration {
	if w == nil {
		return 10 * time.Second
	}
	return w.opts.QueryTimeout
}

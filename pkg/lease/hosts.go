package lease

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// LeashSilentHosts makes the connections of a multi-host configuration
// (host=a,b,c, tried in order) give up early on a host that went silent:
// one whose last connection attempt ended before the server sent its
// first byte (a frozen machine or a stopped postmaster accepts the
// connection and never answers it). Without it every new connection waits
// ConnectTimeout on such a host before it tries the next one: after a
// failover, each connection a pool opens pays it again while the old
// primary stays frozen. With it a silent host gets a leash on later
// attempts, a quarter of ConnectTimeout (between 250 ms and 1 s; 1 s
// without a ConnectTimeout): if it has not answered by then, the attempt
// moves on to the next host. A host is never skipped, only leashed, and it
// is trusted again as soon as it answers within the leash; and while no
// other host of the configuration gives connections (every one silent,
// down, or rejected by ValidateConnect, as target_session_attrs does), none
// is leashed: a slow host may be the only one left. It wraps
// ValidateConnect to learn which hosts give connections. Set it before
// the pool opens:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	lease.LeashSilentHosts(&cfg.ConnConfig.Config)
//
// A connection attempt its caller cancelled teaches nothing of a host.
// A host's silence is remembered for the whole process (by network and
// address), so that every configuration set up with LeashSilentHosts
// leashes a host any of them found silent: a process that opens a second
// pool, or a listener, pays the ConnectTimeout once, not once per pool. A
// configuration with a single host is left as it is: there is no other
// host to move on to. It wraps cfg's own DialFunc.
func LeashSilentHosts(cfg *pgconn.Config) {
	n := hostCount(cfg)
	if n < 2 {
		return
	}
	leash := time.Second
	if cfg.ConnectTimeout > 0 {
		leash = min(max(cfg.ConnectTimeout/4, 250*time.Millisecond), time.Second)
	}
	h := &hostWatch{dial: cfg.DialFunc, leash: leash, hosts: n, seen: map[string]bool{}}
	if h.dial == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		h.dial = d.DialContext
	}
	cfg.DialFunc = h.dialContext
	validate := cfg.ValidateConnect
	cfg.ValidateConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		var err error
		if validate != nil {
			err = validate(ctx, c)
		}
		var np *pgconn.NotPreferredError
		h.gave(c.Conn(), err == nil || errors.As(err, &np))
		return err
	}
}

// hostCount is how many distinct host and port pairs cfg names.
func hostCount(cfg *pgconn.Config) int {
	hosts := map[string]bool{net.JoinHostPort(cfg.Host, itoa(cfg.Port)): true}
	for _, fb := range cfg.Fallbacks {
		hosts[net.JoinHostPort(fb.Host, itoa(fb.Port))] = true
	}
	return len(hosts)
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// silentHosts are the addresses (network and address) whose last
// connection attempt ended before they answered, for the whole process.
var silentHosts struct {
	mu    sync.Mutex
	addrs map[string]bool
}

// hostWatch is the dialer of LeashSilentHosts. seen holds the addresses
// (network and address) it has dialed, as pgconn resolved them, each with
// whether its last attempt gave a connection.
type hostWatch struct {
	dial  pgconn.DialFunc
	leash time.Duration
	hosts int // distinct host and port pairs of the configuration
	mu    sync.Mutex
	seen  map[string]bool
}

// leashed records that key is dialed and reports whether it gets the
// leash: it is silent, and another host of this configuration gave the
// last connection it was asked for (or was not dialed yet). When no other
// one does (every host silent, a cluster too loaded to answer within the
// leash, say; or the others down, refusing, or rejected by
// target_session_attrs), the silent host keeps its whole ConnectTimeout:
// it may be the only one that can give a connection.
func (h *hostWatch) leashed(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.seen[key]; !ok {
		h.seen[key] = false
	}
	if !hostSilent(key) {
		return false
	}
	if len(h.seen) < h.hosts {
		return true // a host not dialed yet may answer
	}
	for k, gave := range h.seen {
		if k != key && gave && !hostSilent(k) {
			return true
		}
	}
	return false
}

// gave records whether the connection c (as dialed by dialContext) gave
// a usable connection.
func (h *hostWatch) gave(c net.Conn, ok bool) {
	if t, isTLS := c.(interface{ NetConn() net.Conn }); isTLS {
		c = t.NetConn()
	}
	if w, isWatched := c.(*watchedConn); isWatched {
		h.setGave(w.addr, ok)
	}
}

func (h *hostWatch) setGave(key string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[key] = ok
}

func hostSilent(addr string) bool {
	silentHosts.mu.Lock()
	defer silentHosts.mu.Unlock()
	return silentHosts.addrs[addr]
}

func markHost(addr string, silent bool) {
	silentHosts.mu.Lock()
	defer silentHosts.mu.Unlock()
	if silent {
		if silentHosts.addrs == nil {
			silentHosts.addrs = map[string]bool{}
		}
		silentHosts.addrs[addr] = true
	} else {
		delete(silentHosts.addrs, addr)
	}
}

func (h *hostWatch) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	key := network + " " + addr
	leashed := h.leashed(key)
	c, err := h.dial(ctx, network, addr)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, err // the caller gave up: nothing learnt of the host
		}
		if isTimeout(err) {
			markHost(key, true)
		}
		h.setGave(key, false)
		return nil, err
	}
	w := &watchedConn{Conn: c, addr: key, watch: h, ctx: ctx}
	if leashed {
		w.leash = time.AfterFunc(h.leash, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if !w.answered.Load() {
				w.cut = true
				_ = c.SetDeadline(time.Unix(1, 0))
			}
		})
	}
	return w, nil
}

// watchedConn is a connection whose first answer, or silence, is recorded
// for its address.
type watchedConn struct {
	net.Conn
	addr     string // network and address
	watch    *hostWatch
	ctx      context.Context // the attempt's: cancelled, a silence is the caller's, not the host's
	leash    *time.Timer     // nil: the host was not silent when dialed
	answered atomic.Bool
	mu       sync.Mutex // orders the first answer and the leash's cut
	cut      bool       // the leash ended the wait for the first answer
}

func (w *watchedConn) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if w.answered.Load() {
		return n, err
	}
	w.mu.Lock()
	cut := w.cut
	if n > 0 && !cut {
		w.answered.Store(true)
	}
	w.mu.Unlock()
	if n > 0 && !cut {
		if w.leash != nil {
			w.leash.Stop()
		}
		markHost(w.addr, false)
		return n, err
	}
	if cut || (err != nil && isTimeout(err) && !errors.Is(w.ctx.Err(), context.Canceled)) {
		w.watch.setGave(w.addr, false)
	}
	if cut {
		// The leash set a past deadline: an answer read as it did
		// comes too late, and the attempt ends here rather than
		// hand out a connection that fails on its next read.
		markHost(w.addr, true)
		return 0, os.ErrDeadlineExceeded
	}
	if err != nil && isTimeout(err) && !errors.Is(w.ctx.Err(), context.Canceled) {
		markHost(w.addr, true)
	}
	return n, err
}

func (w *watchedConn) Close() error {
	if w.leash != nil {
		w.leash.Stop()
	}
	return w.Conn.Close()
}

// isTimeout reports whether err is a deadline passing (the connection's
// context ended while it waited for the server).
func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

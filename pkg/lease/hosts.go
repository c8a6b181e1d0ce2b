package lease

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// LeashSilentHosts makes the connections of a multi-host configuration
// (host=a,b,c, tried in order) give up early on a host that went silent:
// one whose last connection attempt ended before the server sent its first
// byte (a stopped postmaster accepts the connection and never answers it; a
// paused machine does not even complete the TCP handshake). Without it
// every new connection waits ConnectTimeout on such a host before it tries
// the next one: after a failover, each connection a pool opens pays it
// again while the old primary stays frozen. With it a silent host gets a
// leash on later attempts, a quarter of ConnectTimeout (between 250 ms and
// 1 s; 1 s without a ConnectTimeout), handshake included: if it has not
// answered by then, the attempt moves on to the next host. A host is never
// skipped, only leashed, and it is trusted again as soon as it answers.
// When no later host gives the connection (each one silent, down, or
// rejected by ValidateConnect, as target_session_attrs does), the attempt
// tries the hosts the leash cut once more, in order, each with its whole
// ConnectTimeout: a slow primary beside read-only standbys still gives the
// connection, a leash later than it would have. For that second pass it
// appends to cfg.Fallbacks a copy of each host, named "again/host:port"
// (the name a failed connection's error gives it). It wraps cfg's DialFunc,
// LookupFunc and ValidateConnect as they are when it is called: set those
// first. Call it before the pool opens:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	lease.LeashSilentHosts(&cfg.ConnConfig.Config)
//
// A connection attempt its caller cancelled teaches nothing of a host,
// nor one whose deadline gave the host less than half a leash to answer.
// A host's silence is remembered for the whole process (by network and
// address), so that every configuration set up with LeashSilentHosts
// leashes a host any of them found silent: a process that opens a second
// pool, or a listener, pays the ConnectTimeout once, not once per pool. A
// configuration with a single host is left as it is: there is no other
// host to move on to. A second call on the same configuration changes
// nothing.
func LeashSilentHosts(cfg *pgconn.Config) {
	if hostCount(cfg) < 2 || hasSecondPass(cfg) {
		return
	}
	leash := time.Second
	if cfg.ConnectTimeout > 0 {
		leash = min(max(cfg.ConnectTimeout/4, 250*time.Millisecond), time.Second)
	}
	h := &hostWatch{dial: cfg.DialFunc, lookup: cfg.LookupFunc, leash: leash, again: map[string]bool{}}
	if h.dial == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		h.dial = d.DialContext
	}
	if h.lookup == nil {
		h.lookup = net.DefaultResolver.LookupHost
	}
	hosts := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	fallbacks := make([]*pgconn.FallbackConfig, 0, len(cfg.Fallbacks)+len(hosts))
	fallbacks = append(fallbacks, cfg.Fallbacks...)
	for _, fb := range hosts {
		fallbacks = append(fallbacks, &pgconn.FallbackConfig{
			Host:      againPrefix + net.JoinHostPort(fb.Host, itoa(fb.Port)),
			Port:      fb.Port,
			TLSConfig: fb.TLSConfig,
		})
	}
	cfg.Fallbacks = fallbacks
	cfg.DialFunc = h.dialContext
	cfg.LookupFunc = h.lookupHost
	validate := cfg.ValidateConnect
	cfg.ValidateConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		var err error
		if validate != nil {
			err = validate(ctx, c)
		}
		h.gave(c.Conn(), err)
		return err
	}
}

// againPrefix marks the hosts of the second pass (cfg.Fallbacks'
// "again/host:port") and the addresses they resolve to ("again/ip:port").
// No host name, address or socket path begins with it.
const againPrefix = "again/"

// errNotTriedAgain is the second pass's error for a host the leash did
// not cut: its attempt in the first pass ended otherwise.
var errNotTriedAgain = errors.New("lease: not tried again: the leash did not cut its first attempt")

// hasSecondPass reports whether LeashSilentHosts already set cfg up.
func hasSecondPass(cfg *pgconn.Config) bool {
	for _, fb := range cfg.Fallbacks {
		if strings.HasPrefix(fb.Host, againPrefix) {
			return true
		}
	}
	return false
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
// connection attempt ended before they answered, for the whole process,
// each with the number of its silence (a host that answers and falls
// silent again has a new one).
var silentHosts struct {
	mu    sync.Mutex
	addrs map[string]uint64
	count uint64
}

// hostWatch is the dialer of LeashSilentHosts. again holds the addresses
// (network and address, as pgconn resolved them) the second pass tries:
// those whose last attempt in a first pass the leash cut, or that gave
// the last connection asked of them. The record is the configuration's,
// not one connection attempt's (pgconn tells a dialer nothing of the
// attempt it dials for). Of two attempts at once, one may then try again
// a host only the other's leash cut (at most one ConnectTimeout more on
// an attempt that was failing), or not try again a host its leash cut
// whose attempt for the other ended otherwise since (it answered and was
// rejected, say).
type hostWatch struct {
	dial   pgconn.DialFunc
	lookup pgconn.LookupFunc
	leash  time.Duration
	mu     sync.Mutex
	again  map[string]bool
}

// lookupHost is the LookupFunc of LeashSilentHosts: a host of the second
// pass resolves as the host it copies does, each address marked with
// againPrefix for dialContext.
func (h *hostWatch) lookupHost(ctx context.Context, host string) ([]string, error) {
	hostPort, again := strings.CutPrefix(host, againPrefix)
	if !again {
		return h.lookup(ctx, host)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, err
	}
	addrs := []string{host}
	if !isAbsolutePath(host) { // a socket directory: pgconn resolves none
		if addrs, err = h.lookup(ctx, host); err != nil {
			return nil, err
		}
	}
	marked := make([]string, len(addrs))
	for i, a := range addrs {
		if ip, p, err := net.SplitHostPort(a); err == nil {
			marked[i] = net.JoinHostPort(againPrefix+ip, p)
		} else {
			marked[i] = net.JoinHostPort(againPrefix+a, port)
		}
	}
	return marked, nil
}

// isAbsolutePath is pgconn's test of a host that is a socket directory.
func isAbsolutePath(p string) bool {
	return strings.HasPrefix(p, "/") || (len(p) >= 3 && 'A' <= p[0] && p[0] <= 'Z' && p[1] == ':' && p[2] == '\\')
}

// secondPass reports whether network and addr are an address of the
// second pass, and the network and address it stands for.
func secondPass(network, addr string) (string, string, bool) {
	if network != "tcp" || !strings.Contains(addr, againPrefix) {
		return network, addr, false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return network, addr, false
	}
	host, again := strings.CutPrefix(host, againPrefix)
	p, err := strconv.ParseUint(port, 10, 16)
	if !again || err != nil {
		return network, addr, false
	}
	network, addr = pgconn.NetworkAddress(host, uint16(p))
	return network, addr, true
}

// gave records whether the connection c (as dialed by dialContext) gave
// a usable connection: ValidateConnect's err is nil. A host of the second
// pass that is not preferred (target_session_attrs=prefer-standby) stays
// to try again: pgconn dials its copy once more when no host is preferred.
func (h *hostWatch) gave(c net.Conn, err error) {
	if t, isTLS := c.(interface{ NetConn() net.Conn }); isTLS {
		c = t.NetConn()
	}
	w, isWatched := c.(*watchedConn)
	if !isWatched {
		return
	}
	var notPreferred *pgconn.NotPreferredError
	if w.again && errors.As(err, &notPreferred) {
		return
	}
	h.setAgain(w.addr, err == nil)
}

func (h *hostWatch) setAgain(key string, again bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.again[key] = again
}

func (h *hostWatch) triesAgain(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.again[key]
}

func hostSilent(addr string) bool { return silence(addr) != 0 }

// silence is the number of addr's current silence; 0: not silent.
func silence(addr string) uint64 {
	silentHosts.mu.Lock()
	defer silentHosts.mu.Unlock()
	return silentHosts.addrs[addr]
}

func markHost(addr string, silent bool) {
	silentHosts.mu.Lock()
	defer silentHosts.mu.Unlock()
	if silent {
		if silentHosts.addrs == nil {
			silentHosts.addrs = map[string]uint64{}
		}
		if silentHosts.addrs[addr] == 0 {
			silentHosts.count++
			silentHosts.addrs[addr] = silentHosts.count
		}
	} else {
		delete(silentHosts.addrs, addr)
	}
}

// dialContext dials addr. In the first pass it leashes a silent host;
// in the second it dials, with no leash, only a host the record says to
// try again.
func (h *hostWatch) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	network, addr, again := secondPass(network, addr)
	key := network + " " + addr
	if again && !h.triesAgain(key) {
		return nil, errNotTriedAgain
	}
	leashed := !again && hostSilent(key)
	start := time.Now()
	dctx := ctx
	if leashed { // a host that does not even answer the handshake
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, h.leash)
		defer cancel()
	}
	c, err := h.dial(dctx, network, addr)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, err // the caller gave up: nothing learnt of the host
		}
		if ctx.Err() == nil && dctx.Err() != nil { // cut by the leash
			h.setAgain(key, true)
			return nil, err
		}
		if isTimeout(err) && h.hadTime(ctx, start) {
			markHost(key, true)
		}
		if !again {
			h.setAgain(key, false)
		}
		return nil, err
	}
	w := &watchedConn{Conn: c, addr: key, watch: h, ctx: ctx, start: start, again: again}
	if leashed {
		w.leash = time.AfterFunc(h.leash-time.Since(start), func() {
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
	start    time.Time       // when it was dialed
	again    bool            // dialed by the second pass
	leash    *time.Timer     // nil: not leashed
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
	switch {
	case cut:
		// The leash set a past deadline: an answer read as it did
		// comes too late, and the attempt ends here rather than
		// hand out a connection that fails on its next read.
		markHost(w.addr, true)
		w.watch.setAgain(w.addr, true)
		return 0, os.ErrDeadlineExceeded
	case n > 0:
		if w.leash != nil {
			w.leash.Stop()
		}
		markHost(w.addr, false)
		w.ended() // until ValidateConnect says it gave the connection
	case err != nil && !errors.Is(w.ctx.Err(), context.Canceled):
		if isTimeout(err) && w.watch.hadTime(w.ctx, w.start) {
			markHost(w.addr, true)
		}
		w.ended()
	}
	return n, err
}

// ended records that the first pass's attempt ended otherwise than cut
// by the leash: the second pass does not try the host again. An attempt
// of the second pass changes nothing: the copy of the same host that
// follows it (sslmode=prefer's attempt without TLS) is still tried.
func (w *watchedConn) ended() {
	if !w.again {
		w.watch.setAgain(w.addr, false)
	}
}

func (w *watchedConn) Close() error {
	if w.leash != nil {
		w.leash.Stop()
	}
	return w.Conn.Close()
}

// hadTime reports whether an attempt dialed at start whose context ctx
// ended gave its host time enough to answer (half a leash) for its silence
// to count: a caller's shorter deadline says nothing of the host.
func (h *hostWatch) hadTime(ctx context.Context, start time.Time) bool {
	deadline, ok := ctx.Deadline()
	return !ok || deadline.Sub(start) >= h.leash/2
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

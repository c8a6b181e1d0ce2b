package lease_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// refusedPort is a TCP port on 127.0.0.1 nothing listens on (a host whose
// postmaster is down: it refuses at once).
func refusedPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := uint16(ln.Addr().(*net.TCPAddr).Port)
	_ = ln.Close()
	return p
}

// A host that went silent once and now answers, slower than the leash,
// while the configuration's other host is down (refuses): the slow host is
// the only one that can give a connection: cut by the leash, it is tried
// again with its whole ConnectTimeout, and gives the connection.
func TestLeashSilentHostsSlowHostOtherDown(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: refusedPort(t)}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through a frozen host and a refusing one")
	}
	// The first host thaws but answers 2 s after it accepts, eight
	// leashes, well within an hour's ConnectTimeout.
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour
	if p := landedOn(t, ctx, cfg, "connection to the slow host"); p != a.port() {
		t.Fatalf("connection landed on port %d, want the slow host (%d)", p, a.port())
	}
}

// gatedConn holds its first Read until the leash sets a past deadline,
// and lets that deadline take effect only once the Read has returned the
// server's first answer: the answer arrives just as the leash ends.
type gatedConn struct {
	net.Conn
	open     chan struct{} // closed by the past deadline
	readDone chan struct{} // closed when the first Read returned bytes
	once     sync.Once
	rOnce    sync.Once
}

func (g *gatedConn) Read(b []byte) (int, error) {
	<-g.open
	n, err := g.Conn.Read(b)
	if n > 0 {
		g.rOnce.Do(func() { close(g.readDone) })
	}
	return n, err
}

func (g *gatedConn) SetDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now()) {
		first := false
		g.once.Do(func() { first = true; close(g.open) })
		if first {
			<-g.readDone
		}
	}
	return g.Conn.SetDeadline(t)
}

// The leash ends the wait just as the silent host's first answer arrives:
// either the attempt fails and the next host gives the connection, or the
// connection is the first host's and works; never a connection handed out
// with the leash's past deadline still set on it.
func TestLeashSilentHostsAnswerAtTheLeash(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	aAddr := net.JoinHostPort("127.0.0.1", itoaPort(a.port()))
	var gated bool
	var mu sync.Mutex
	d := &net.Dialer{}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.ConnectTimeout = 300 * time.Millisecond
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || addr != aAddr || !gated {
			return c, err
		}
		return &gatedConn{Conn: c, open: make(chan struct{}), readDone: make(chan struct{})}, nil
	}
	lease.LeashSilentHosts(&cfg.Config)
	// The first attempt finds the first host frozen: silent from now on.
	landedOn(t, ctx, cfg, "first connection")
	a.frozen.Store(false)
	mu.Lock()
	gated = true
	mu.Unlock()
	cfg.ConnectTimeout = time.Hour
	for i := 0; i < 3; i++ {
		landedOn(t, ctx, cfg, "connection whose first host answers at the leash")
	}
}

func itoaPort(p uint16) string { return strconv.Itoa(int(p)) }

// The same with the other host answering but rejected by the
// configuration's ValidateConnect (a standby under
// target_session_attrs=read-write): the slow host is still the only one
// that gives a connection, and gives it when tried again.
func TestLeashSilentHostsSlowHostOtherRejected(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a, b := newSilentHost(t, server), newSilentHost(t, server)
	b.frozen.Store(false)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: b.port()}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	errStandby := errors.New("a standby")
	cfg.ValidateConnect = func(_ context.Context, c *pgconn.PgConn) error {
		if c.Conn().RemoteAddr().(*net.TCPAddr).Port == int(b.port()) {
			return errStandby
		}
		return nil
	}
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through a frozen host and a rejected one")
	}
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour
	if p := landedOn(t, ctx, cfg, "connection to the slow host"); p != a.port() {
		t.Fatalf("connection landed on port %d, want the slow host (%d)", p, a.port())
	}
}

// A caller that gives up its connection attempt (cancels its context)
// while a host has not answered yet learns nothing about that host: the
// host is not marked silent, and a later connection gives it its whole
// ConnectTimeout.
func TestLeashSilentHostsCallerCancelIsNoSilence(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.ConnectTimeout = 4 * time.Second // the leash: 1 s
	var armed atomic.Bool
	dialed := make(chan struct{}, 1)
	d := &net.Dialer{}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil && armed.CompareAndSwap(true, false) {
			dialed <- struct{}{}
		}
		return c, err
	}
	lease.LeashSilentHosts(&cfg.Config)
	// Frozen: the first host is silent, the second gives the connection.
	cfg.ConnectTimeout = 300 * time.Millisecond
	landedOn(t, ctx, cfg, "first connection")
	// Thawed: it answers within the leash and is trusted again.
	cfg.ConnectTimeout = time.Hour
	a.frozen.Store(false)
	if p := landedOn(t, ctx, cfg, "connection after the thaw"); p != a.port() {
		t.Fatalf("connection after the thaw landed on port %d, want the first host (%d)", p, a.port())
	}
	// Frozen again, and the caller cancels as soon as the first host
	// accepted: that says nothing of the host.
	a.frozen.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	armed.Store(true)
	go func() { <-dialed; cancel() }()
	if _, err := pgx.ConnectConfig(cctx, cfg); err == nil {
		t.Fatal("connected with the context cancelled")
	}
	// Slow now (4 s, four leashes): it is not leashed, and gives the
	// connection.
	a.delay.Store(int64(4 * time.Second))
	a.frozen.Store(false)
	if p := landedOn(t, ctx, cfg, "connection after the caller's cancel"); p != a.port() {
		t.Fatalf("connection landed on port %d, want the first host (%d)", p, a.port())
	}
}

// standbys rejects, in ValidateConnect, the connections that reach a port
// it holds as a standby (target_session_attrs=read-write would).
type standbys struct {
	mu    sync.Mutex
	ports map[int]bool
}

var errStandbyHost = errors.New("a standby")

func (s *standbys) set(p uint16, standby bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ports[int(p)] = standby
}

func (s *standbys) validate(_ context.Context, c *pgconn.PgConn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := c.Conn().RemoteAddr().(*net.TCPAddr); ok && s.ports[a.Port] {
		return errStandbyHost
	}
	return nil
}

// dials counts the connections a configuration dialed, by address.
type dials struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *dials) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[addr]
}

// threeHosts is a configuration of the hosts a, b, c (in that order),
// with LeashSilentHosts and st's ValidateConnect; d counts its dials.
func threeHosts(t *testing.T, dsn string, st *standbys, a, b, c *silentHost) (*pgx.ConnConfig, *dials) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: b.port()}, {Host: "127.0.0.1", Port: c.port()}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	cfg.ValidateConnect = st.validate
	d := &dials{n: map[string]int{}}
	var dialer net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		d.n[addr]++
		d.mu.Unlock()
		return dialer.DialContext(ctx, network, addr)
	}
	lease.LeashSilentHosts(&cfg.Config)
	return cfg, d
}

// addr is the silent host's TCP address.
func (h *silentHost) addr() string { return h.ln.Addr().String() }

// A failover from a frozen primary: the first host accepts and never
// answers, the two others answer but are standbys, so connections fail;
// then the second host is promoted. The next connection, with an hour's
// ConnectTimeout, gives the frozen host a leash only and reaches the new
// primary (without the leash it would wait for the frozen host until the
// test's context ends). While no host could give a connection, each
// failing attempt dialed the standbys once, and the frozen host once more
// only after the leash had cut it.
func TestLeashSilentHostsFailoverFromFrozenPrimary(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a, b, c := newSilentHost(t, server), newSilentHost(t, server), newSilentHost(t, server)
	b.frozen.Store(false)
	c.frozen.Store(false)
	st := &standbys{ports: map[int]bool{int(b.port()): true, int(c.port()): true}}
	cfg, d := threeHosts(t, dsn, st, a, b, c)
	// The first attempt waits its ConnectTimeout on the frozen host, the
	// second cuts it at the leash, then tries it again with its whole
	// ConnectTimeout after the standbys refused.
	for i, wantA := range []int{1, 2} {
		a0, b0, c0 := d.count(a.addr()), d.count(b.addr()), d.count(c.addr())
		if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
			t.Fatalf("attempt %d: connected with no primary", i)
		}
		if got := d.count(a.addr()) - a0; got != wantA {
			t.Errorf("attempt %d: the frozen host was dialed %d times, want %d", i, got, wantA)
		}
		if gb, gc := d.count(b.addr())-b0, d.count(c.addr())-c0; gb != 1 || gc != 1 {
			t.Errorf("attempt %d: the standbys were dialed %d and %d times, want once each", i, gb, gc)
		}
	}
	// The second host is promoted.
	st.set(b.port(), false)
	cfg.ConnectTimeout = time.Hour
	if p := landedOn(t, ctx, cfg, "connection after the promotion"); p != b.port() {
		t.Fatalf("connection after the promotion landed on port %d, want the new primary (%d)", p, b.port())
	}
	// So do pgconn's and a pool's connections, which connect with the
	// configuration itself and with a copy of it.
	pc, err := pgconn.ConnectConfig(ctx, &cfg.Config)
	if err != nil {
		t.Fatalf("pgconn's connection after the promotion: %v", err)
	}
	defer pc.Close(ctx)
	if p := pc.Conn().RemoteAddr().(*net.TCPAddr).Port; p != int(b.port()) {
		t.Fatalf("pgconn's connection landed on port %d, want the new primary (%d)", p, b.port())
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig = cfg
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("a pool's connection after the promotion: %v", err)
	}
	defer conn.Release()
	if p := conn.Conn().PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port; p != int(b.port()) {
		t.Fatalf("a pool's connection landed on port %d, want the new primary (%d)", p, b.port())
	}
}

// A slow primary beside two standbys, after a failover back to it: the
// first host, frozen, was silent while the second was the primary; now
// the first answers, slower than the leash, and the second and third are
// standbys. Every connection reaches the first host: the leash cuts it
// while it is silent, and once the standbys refused it is tried again
// with its whole ConnectTimeout.
func TestLeashSilentHostsSlowPrimaryBesideStandbys(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a, b, c := newSilentHost(t, server), newSilentHost(t, server), newSilentHost(t, server)
	b.frozen.Store(false)
	c.frozen.Store(false)
	st := &standbys{ports: map[int]bool{int(c.port()): true}}
	cfg, _ := threeHosts(t, dsn, st, a, b, c)
	if p := landedOn(t, ctx, cfg, "connection to the second host"); p != b.port() {
		t.Fatalf("connection landed on port %d, want the second host (%d)", p, b.port())
	}
	// Back to the first host, slow: it answers 2 s after it accepts, eight
	// leashes.
	st.set(b.port(), true)
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour // the leash stays 250 ms (LeashSilentHosts set it)
	for i := 0; i < 3; i++ {
		if p := landedOn(t, ctx, cfg, "connection to the slow primary"); p != a.port() {
			t.Fatalf("connection %d landed on port %d, want the slow primary (%d)", i, p, a.port())
		}
	}
}

// The slow primary beside standbys, its host tried twice as
// sslmode=prefer does (with TLS, then without, the server refusing TLS):
// the second pass tries both, as the first did.
func TestLeashSilentHostsSecondPassWithoutTLS(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a, b := newSilentHost(t, server), newSilentHost(t, server)
	b.frozen.Store(false)
	st := &standbys{ports: map[int]bool{int(b.port()): true}}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), &tls.Config{InsecureSkipVerify: true}
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: a.port()}, {Host: "127.0.0.1", Port: b.port()}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	cfg.ValidateConnect = st.validate
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through a frozen host and a standby")
	}
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour // the leash stays 250 ms (LeashSilentHosts set it)
	if p := landedOn(t, ctx, cfg, "connection to the slow primary"); p != a.port() {
		t.Fatalf("connection landed on port %d, want the slow primary (%d)", p, a.port())
	}
}

// The slow primary beside a standby, the primary's host a socket
// directory: its copy in the second pass is that directory's socket.
func TestLeashSilentHostsSecondPassSocket(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	dir, err := os.MkdirTemp("", "leash")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	const port = 5432
	_, sock := pgconn.NetworkAddress(dir, port)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	a, b := silentHostOn(t, server, ln), newSilentHost(t, server)
	b.frozen.Store(false)
	st := &standbys{ports: map[int]bool{int(b.port()): true}}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = dir, port, nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: b.port()}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	cfg.ValidateConnect = st.validate
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through a frozen socket and a standby")
	}
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour // the leash stays 250 ms (LeashSilentHosts set it)
	before := a.accepted.Load()
	if p := landedOn(t, ctx, cfg, "connection to the slow primary"); p != 0 {
		t.Fatalf("connection landed on port %d, want the socket", p)
	}
	if got := a.accepted.Load() - before; got != 2 {
		t.Fatalf("the socket accepted %d connections, want 2 (cut by the leash, then tried again)", got)
	}
}

// target_session_attrs=prefer-standby with a slow primary and no standby
// up: the primary's host, cut by the leash, is tried again and answers as
// a primary (not preferred); with no standby, the connection is the
// primary's, as it would be without the leash.
func TestLeashSilentHostsSecondPassNotPreferred(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: refusedPort(t)}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsPreferStandby
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through a frozen host and a refusing one")
	}
	a.delay.Store(int64(2 * time.Second))
	a.frozen.Store(false)
	cfg.ConnectTimeout = time.Hour // the leash stays 250 ms (LeashSilentHosts set it)
	if p := landedOn(t, ctx, cfg, "connection to the slow primary"); p != a.port() {
		t.Fatalf("connection landed on port %d, want the slow primary (%d)", p, a.port())
	}
}

// unansweredPort is a TCP port on 127.0.0.1 whose SYNs go unanswered (a
// paused machine, or a partition): a listener with a backlog of one,
// filled and never accepted.
func unansweredPort(t *testing.T) uint16 {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	p := uint16(sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoaPort(p)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = filler.Close() })
	return p
}

// A host that does not even answer the TCP handshake (a paused machine):
// once silent, its dial is leashed too.
func TestLeashSilentHostsLeashesTheDial(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", unansweredPort(t), nil
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	lease.LeashSilentHosts(&cfg.Config)
	if p := landedOn(t, ctx, cfg, "first connection"); p == cfg.Port {
		t.Fatal("first connection landed on the paused host")
	}
	// Without a leash on the dial, this waits for the paused host until
	// its context ends.
	cfg.ConnectTimeout = time.Hour
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	landedOn(t, cctx, cfg, "second connection")
}

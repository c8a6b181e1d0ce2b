package lease_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// the only one that can give a connection, so it keeps its whole
// ConnectTimeout instead of being cut by the leash on every connection.
func TestLeashSilentHostsSlowHostOtherDown(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
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
	dsn := pgtest.NewDatabase(t)
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
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
// that gives a connection, and keeps its whole ConnectTimeout.
func TestLeashSilentHostsSlowHostOtherRejected(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
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
	dsn := pgtest.NewDatabase(t)
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
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

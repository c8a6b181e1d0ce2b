package lease_test

import (
	"context"
	"io"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// newServer is a new database of the test server: its DSN and the
// connection configuration it parses to.
func newServer(t *testing.T) (string, *pgconn.Config) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return dsn, server
}

// silentHost is a TCP address in front of a real server: frozen, it accepts
// connections and never answers them (a stopped machine); thawed, it
// forwards them to the server.
type silentHost struct {
	ln       net.Listener
	network  string // the server's
	address  string
	frozen   atomic.Bool
	delay    atomic.Int64 // thawed: how long it waits before it forwards (ns)
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
	closed   chan struct{} // closed when the test ends
}

func newSilentHost(t *testing.T, server *pgconn.Config) *silentHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return silentHostOn(t, server, ln)
}

// silentHostOn is a silent host accepting on ln.
func silentHostOn(t *testing.T, server *pgconn.Config, ln net.Listener) *silentHost {
	t.Helper()
	network, address := pgconn.NetworkAddress(server.Host, server.Port)
	h := &silentHost{ln: ln, network: network, address: address, closed: make(chan struct{})}
	h.frozen.Store(true)
	go h.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		close(h.closed)
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			_ = c.Close()
		}
	})
	return h
}

func (h *silentHost) hold(c net.Conn) {
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
}

func (h *silentHost) serve() {
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.accepted.Add(1)
		h.hold(c)
		if h.frozen.Load() {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		go h.forward(c, time.Duration(h.delay.Load()))
	}
}

// forward connects c to the server after delay (a slow host).
func (h *silentHost) forward(c net.Conn, delay time.Duration) {
	wait := time.NewTimer(delay)
	defer wait.Stop()
	select {
	case <-wait.C:
	case <-h.closed:
		_ = c.Close()
		return
	}
	s, err := net.Dial(h.network, h.address)
	if err != nil {
		_ = c.Close()
		return
	}
	h.hold(s)
	go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
	_, _ = io.Copy(c, s)
	_ = c.Close()
}

// port is the silent host's port.
func (h *silentHost) port() uint16 { return uint16(h.ln.Addr().(*net.TCPAddr).Port) }

// landedOn connects with cfg, checks the connection works, and returns the
// TCP port it reached (0: not TCP).
func landedOn(t *testing.T, ctx context.Context, cfg *pgx.ConnConfig, what string) uint16 {
	t.Helper()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if a, ok := conn.PgConn().Conn().RemoteAddr().(*net.TCPAddr); ok {
		return uint16(a.Port)
	}
	return 0
}

// A multi-host configuration whose first host is frozen: the first
// connection waits its ConnectTimeout there, then reaches the second host.
// With LeashSilentHosts the next one, even with an hour's ConnectTimeout,
// gives the frozen host a leash only and reaches the second host too; so
// does another configuration of the process; once the first host answers
// again, a connection lands there.
func TestLeashSilentHosts(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	h := newSilentHost(t, server)
	config := func(timeout time.Duration) *pgx.ConnConfig {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
		cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", h.port(), nil
		cfg.ConnectTimeout = timeout
		lease.LeashSilentHosts(&cfg.Config)
		return cfg
	}

	// The first attempt meets the frozen host unwarned: its ConnectTimeout.
	cfg := config(500 * time.Millisecond)
	if p := landedOn(t, ctx, cfg, "first connection"); p == h.port() {
		t.Fatal("first connection landed on the frozen host")
	}
	// An hour's timeout: without the leash these connections wait for the
	// frozen host until the test's context ends.
	cfg.ConnectTimeout = time.Hour
	before := h.accepted.Load()
	if p := landedOn(t, ctx, cfg, "second connection"); p == h.port() {
		t.Fatal("second connection landed on the frozen host")
	}
	if h.accepted.Load() == before {
		t.Fatal("the frozen host was skipped, not tried under a leash")
	}
	if p := landedOn(t, ctx, config(time.Hour), "another configuration's connection"); p == h.port() {
		t.Fatal("another configuration's connection landed on the frozen host")
	}
	// Thawed, the first host answers within the leash and is used again.
	h.frozen.Store(false)
	if p := landedOn(t, ctx, cfg, "connection after the thaw"); p != h.port() {
		t.Fatalf("connection after the thaw landed on port %d, want the first host (%d)", p, h.port())
	}
}

// A single-host configuration has no other host to move on to: it is
// left as it is (its own DialFunc, its own ConnectTimeout on a silent host).
func TestLeashSilentHostsLeavesASingleHost(t *testing.T) {
	cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=5432 user=nobody dbname=x sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	own := reflect.ValueOf(cfg.DialFunc).Pointer()
	lease.LeashSilentHosts(cfg)
	if reflect.ValueOf(cfg.DialFunc).Pointer() != own {
		t.Fatal("LeashSilentHosts replaced a single-host configuration's DialFunc")
	}
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: 5433}}
	lease.LeashSilentHosts(cfg)
	if reflect.ValueOf(cfg.DialFunc).Pointer() == own {
		t.Fatal("LeashSilentHosts left a two-host configuration's DialFunc as it was")
	}
}

// When every host of a configuration went silent (a cluster too loaded to
// answer in time, say), none is leashed for ever: a host slower than the
// leash is cut by it, then tried again with its whole ConnectTimeout, and
// gives the connection.
func TestLeashSilentHostsAllSilent(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a, b := newSilentHost(t, server), newSilentHost(t, server)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: b.port()}}
	cfg.ConnectTimeout = 300 * time.Millisecond // the leash: 250 ms
	lease.LeashSilentHosts(&cfg.Config)
	if _, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		t.Fatal("connected through two frozen hosts")
	}
	// Both silent now. Thawed but slow: each answers 2 s after it accepts,
	// eight leashes, within an hour's ConnectTimeout.
	for _, h := range []*silentHost{a, b} {
		h.delay.Store(int64(2 * time.Second))
		h.frozen.Store(false)
	}
	cfg.ConnectTimeout = time.Hour
	if p := landedOn(t, ctx, cfg, "connection to slow hosts"); p != a.port() {
		t.Fatalf("connection to slow hosts landed on port %d, want the first host (%d)", p, a.port())
	}
}

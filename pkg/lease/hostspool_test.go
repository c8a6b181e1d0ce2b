package lease_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// stallProxy forwards TCP connections to a server until it is frozen:
// then it stops passing bytes either way on every connection, old and
// new, and keeps them open (a paused machine).
type stallProxy struct {
	ln      net.Listener
	network string
	address string
	mu      sync.Mutex
	frozen  bool
	thawed  *sync.Cond
	conns   []net.Conn
}

func newStallProxy(t *testing.T, server *pgconn.Config) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	network, address := pgconn.NetworkAddress(server.Host, server.Port)
	p := &stallProxy{ln: ln, network: network, address: address}
	p.thawed = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.frozen = false
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.thawed.Broadcast()
	})
	return p
}

func (p *stallProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *stallProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
}

func (p *stallProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial(p.network, p.address)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pass(s, c)
		go p.pass(c, s)
	}
}

// pass copies src to dst, holding each read back while frozen.
func (p *stallProxy) pass(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		p.mu.Lock()
		for p.frozen {
			p.thawed.Wait()
		}
		p.mu.Unlock()
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.frozen {
			p.thawed.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// frontedBy makes cfg try 127.0.0.1:port first, then the server it names.
func frontedBy(cfg *pgconn.Config, port uint16) {
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", port, nil
}

// leashedPool is a pool of one connection on dsn's server fronted by
// 127.0.0.1:port, with an hour's ConnectTimeout, set up by
// LeashSilentHostsPool.
func leashedPool(t *testing.T, ctx context.Context, dsn string, port uint16) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	frontedBy(&pcfg.ConnConfig.Config, port)
	pcfg.ConnConfig.ConnectTimeout = time.Hour
	pcfg.MaxConns = 1
	lease.LeashSilentHostsPool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// statementOn runs a statement on a connection of pool and returns the
// port it reached and its backend's pid.
func statementOn(t *testing.T, ctx context.Context, pool *pgxpool.Pool, what string) (uint16, uint32) {
	t.Helper()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer c.Release()
	if _, err := c.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return uint16(c.Conn().PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port), c.Conn().PgConn().PID()
}

// A pool holds an idle connection to the first host when that host
// freezes and another connection attempt of the process finds it silent:
// the pool's next statement does not run on that connection (it would wait
// for the frozen host until its context ends) but on a new one, which the
// leash takes to the second host.
func TestLeashSilentHostsPoolDropsIdleConnectionsToASilentHost(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	p := newStallProxy(t, server)
	pool := leashedPool(t, ctx, dsn, p.port())
	port := func(what string) uint16 { port, _ := statementOn(t, ctx, pool, what); return port }
	if got := port("before the freeze"); got != p.port() {
		t.Fatalf("before the freeze the pool's connection reached port %d, want the first host (%d)", got, p.port())
	}

	p.freeze()
	// Another connection of the process meets the frozen host: its
	// ConnectTimeout, then the second host. The host is now known silent.
	other, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	frontedBy(&other.Config, p.port())
	other.ConnectTimeout = 300 * time.Millisecond
	lease.LeashSilentHosts(&other.Config)
	if got := landedOn(t, ctx, other, "another connection"); got == p.port() {
		t.Fatal("another connection landed on the frozen host")
	}

	if got := port("after the freeze"); got == p.port() {
		t.Fatal("the pool's statement after the freeze ran on the frozen host")
	}
}

// The wrapped hooks still run: a BeforeAcquire of the caller's refuses a
// connection as before.
func TestLeashSilentHostsPoolKeepsBeforeAcquire(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Fallbacks = []*pgconn.FallbackConfig{{Host: pcfg.ConnConfig.Host, Port: pcfg.ConnConfig.Port}}
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = "127.0.0.1", refusedPort(t)
	var asked int
	var mu sync.Mutex
	pcfg.BeforeAcquire = func(_ context.Context, _ *pgx.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		asked++
		return asked > 1 // the first connection is refused and closed
	}
	lease.LeashSilentHostsPool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked < 2 {
		t.Fatalf("BeforeAcquire asked %d times, want the refused connection and another", asked)
	}
}

// A caller whose own deadline, shorter than a leash, passes while a host
// has not answered yet learns nothing of the host: a pool's idle
// connection to it stays in use.
func TestLeashSilentHostsShortCallerDeadlineIsNoSilence(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	a.frozen.Store(false)
	pool := leashedPool(t, ctx, dsn, a.port())
	pid := func(what string) uint32 { _, pid := statementOn(t, ctx, pool, what); return pid }
	first := pid("first statement")

	// The first host now answers new connections after 2 s; another
	// connection of the process gives up after 50 ms.
	a.delay.Store(int64(2 * time.Second))
	other, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	frontedBy(&other.Config, a.port())
	other.ConnectTimeout = time.Hour
	lease.LeashSilentHosts(&other.Config)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if c, err := pgx.ConnectConfig(short, other); err == nil {
		_ = c.Close(ctx)
		t.Fatal("connected within 50 ms to a host that answers after 2 s")
	}
	if got := pid("statement after the caller's deadline"); got != first {
		t.Fatalf("the pool's statement ran on a new connection (pid %d, was %d): its idle one was dropped", got, first)
	}
}

// The same with the pool's connection idle for more than a second, which
// pgxpool pings before it hands it out: the ping does not wait for the
// frozen host either.
func TestLeashSilentHostsPoolDropsLongIdleConnections(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	p := newStallProxy(t, server)
	pool := leashedPool(t, ctx, dsn, p.port())
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Release()

	p.freeze()
	// Another connection of the process waits 1.5 s for the frozen host
	// (the pool's connection is idle meanwhile), then reaches the second.
	other, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	frontedBy(&other.Config, p.port())
	other.ConnectTimeout = 1500 * time.Millisecond
	lease.LeashSilentHosts(&other.Config)
	if got := landedOn(t, ctx, other, "another connection"); got == p.port() {
		t.Fatal("another connection landed on the frozen host")
	}

	// Without the leash on the ping, this waits for the frozen host.
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := pool.Exec(actx, `SELECT 1`); err != nil {
		t.Fatalf("the pool's statement after the freeze: %v", err)
	}
}

// A host whose postmaster stopped answering new connections while its
// backends still serve the established ones (a connection storm, say): a
// pool's idle connection to it, which works, stays in use.
func TestLeashSilentHostsPoolKeepsWorkingConnections(t *testing.T) {
	ctx := testCtx(t)
	dsn, server := newServer(t)
	a := newSilentHost(t, server)
	a.frozen.Store(false)
	twoHosts := func(cfg *pgconn.Config, timeout time.Duration) {
		cfg.Host, cfg.Port, cfg.TLSConfig = "127.0.0.1", a.port(), nil
		cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: "127.0.0.1", Port: refusedPort(t)}}
		cfg.ConnectTimeout = timeout
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	twoHosts(&pcfg.ConnConfig.Config, time.Hour)
	pcfg.MaxConns = 1
	lease.LeashSilentHostsPool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pid := func(ctx context.Context, what string) uint32 { _, pid := statementOn(t, ctx, pool, what); return pid }
	first := pid(ctx, "first statement")

	// New connections go unanswered: another connection of the process
	// finds the host silent.
	a.frozen.Store(true)
	other, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	twoHosts(&other.Config, 300*time.Millisecond)
	lease.LeashSilentHosts(&other.Config)
	if c, err := pgx.ConnectConfig(ctx, other); err == nil {
		_ = c.Close(ctx)
		t.Fatal("connected through a silent host and a refusing one")
	}

	// Without the fix the pool drops its working connection and waits for
	// a new one to the silent host.
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if got := pid(actx, "statement after the silence"); got != first {
		t.Fatalf("the pool's statement ran on a new connection (pid %d, was %d)", got, first)
	}
}

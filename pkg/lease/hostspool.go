package lease

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LeashSilentHostsPool is LeashSilentHosts for a pool, which also keeps
// the connections it already holds off a silent host: an idle connection
// to a host that some connection attempt of the process has found silent
// since is pinged, under the leash, when the pool would hand it out, and
// closed if it does not answer; another one is then taken or opened
// instead. Without it, after a failover from a frozen primary, the first
// statement on each idle connection to it waits until its deadline (a
// frozen machine keeps its TCP connections open), and so does pgxpool's
// own ping of a connection idle for more than a second (skipped for such
// a connection: the leashed ping replaces it). A connection that answers
// is kept: a host whose postmaster is too busy to answer new connections
// may still serve the established ones. Once a ping found the host's
// silence real, its other idle connections are closed without one. Set
// it before the pool opens, after any PrepareConn, BeforeAcquire or
// ShouldPing of your own (it wraps them):
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	lease.LeashSilentHostsPool(cfg)
//
// A configuration with a single host is left as it is.
func LeashSilentHostsPool(cfg *pgxpool.Config) {
	if hostCount(&cfg.ConnConfig.Config) < 2 {
		return
	}
	LeashSilentHosts(&cfg.ConnConfig.Config)
	prepare := cfg.PrepareConn
	if prepare == nil && cfg.BeforeAcquire != nil {
		before := cfg.BeforeAcquire
		prepare = func(ctx context.Context, c *pgx.Conn) (bool, error) { return before(ctx, c), nil }
	}
	shouldPing := cfg.ShouldPing
	if shouldPing == nil { // pgxpool's default
		shouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > time.Second }
	}
	dead := &deadSilences{silences: map[string]uint64{}}
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		if w := watched(p.Conn.PgConn().Conn()); w != nil && hostSilent(w.addr) {
			return false // PrepareConn pings it, under the leash
		}
		return shouldPing(ctx, p)
	}
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if !dead.answers(ctx, c) {
			return false, nil // closed; the pool takes another
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
}

// deadSilences are, by address, the silences a pool's ping found real.
type deadSilences struct {
	mu       sync.Mutex
	silences map[string]uint64
}

// answers reports whether c may be handed out: its host is not silent, or
// it answers a ping within the leash.
func (d *deadSilences) answers(ctx context.Context, c *pgx.Conn) bool {
	w := watched(c.PgConn().Conn())
	if w == nil {
		return true
	}
	s := silence(w.addr)
	if s == 0 {
		return true
	}
	d.mu.Lock()
	dead := d.silences[w.addr] == s
	d.mu.Unlock()
	if dead {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, w.watch.leash)
	defer cancel()
	if err := c.Ping(pctx); err == nil {
		return true
	}
	// pgx closes it in the background, and waits up to 15 s for the
	// silent host to end it: end it now.
	_ = w.Close()
	if pctx.Err() != nil && ctx.Err() == nil { // the leash ran out
		d.mu.Lock()
		d.silences[w.addr] = s
		d.mu.Unlock()
	}
	return false
}

// watched is c as dialed under LeashSilentHosts; nil: not.
func watched(c net.Conn) *watchedConn {
	if t, isTLS := c.(interface{ NetConn() net.Conn }); isTLS {
		c = t.NetConn()
	}
	w, _ := c.(*watchedConn)
	return w
}

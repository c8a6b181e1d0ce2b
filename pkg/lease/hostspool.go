package lease

import (
	"context"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LeashSilentHostsPool is LeashSilentHosts for a pool, which also keeps
// the connections it already holds off a silent host: an idle connection
// to a host that some connection attempt of the process has found silent
// since is closed when the pool would hand it out, and another one is
// taken or opened instead. Without it, after a failover from a frozen
// primary, the first statement on each idle connection to it waits until
// its deadline (a frozen machine keeps its TCP connections open); so
// would pgxpool's ping of a connection idle for more than a second, which
// it therefore skips. Set it before the pool opens, after any PrepareConn,
// BeforeAcquire or ShouldPing of your own (it wraps them):
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
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		if onSilentHost(p.Conn.PgConn().Conn()) {
			return false // PrepareConn closes it
		}
		return shouldPing(ctx, p)
	}
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if onSilentHost(c.PgConn().Conn()) {
			return false, nil // closed; the pool takes another
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
}

// onSilentHost reports whether c, dialed under LeashSilentHosts, leads to
// a host found silent since.
func onSilentHost(c net.Conn) bool {
	if t, isTLS := c.(interface{ NetConn() net.Conn }); isTLS {
		c = t.NetConn()
	}
	w, ok := c.(*watchedConn)
	return ok && hostSilent(w.addr)
}

package robustness

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// cluster is the server the faults act on: the primary, and for failover
// faults its asynchronous standby (the next primary). Clock offsets are set
// on both, so a promoted standby keeps the clock the clients saw.
type cluster struct {
	mu      sync.Mutex
	primary *pgserver.Server
	standby *pgserver.Server
	proxy   *Proxy
	clock   bool
	offset  time.Duration
	n       int // failovers done
}

func (c *cluster) Kill() error { return c.current().Kill() }

func (c *cluster) Start(ctx context.Context) error { return c.current().Start(ctx) }

func (c *cluster) current() *pgserver.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

func (c *cluster) SetClockOffset(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = d
	err := c.primary.SetClockOffset(d)
	if c.standby != nil {
		if serr := c.standby.SetClockOffset(d); err == nil {
			err = serr
		}
	}
	return err
}

func (c *cluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.primary.Close()
	if c.standby != nil {
		_ = c.standby.Close()
	}
}

// addStandby makes a new asynchronous standby of the primary.
func (c *cluster) addStandby(ctx context.Context) error {
	c.mu.Lock()
	p := c.primary
	c.mu.Unlock()
	st, err := p.StartStandby(ctx, pgserver.StandbyOptions{})
	if err != nil {
		return err
	}
	if c.clock {
		c.mu.Lock()
		off := c.offset
		c.mu.Unlock()
		if err := st.SetClockOffset(off); err != nil {
			_ = st.Close()
			return err
		}
	}
	c.mu.Lock()
	c.standby = st
	c.mu.Unlock()
	return nil
}

// failover cuts the standby off, lets the primary run for tail (what it
// acknowledges then is never replayed), kills it, promotes the standby,
// points the proxy at it (cutting every connection), and makes a new
// standby.
func (c *cluster) failover(ctx context.Context, tail time.Duration) (string, error) {
	c.mu.Lock()
	p, st := c.primary, c.standby
	c.mu.Unlock()
	if st == nil {
		return "", fmt.Errorf("no standby")
	}
	if err := st.StopStreaming(ctx); err != nil {
		return "", err
	}
	sleepCtx(ctx, tail)
	if err := p.Kill(); err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := st.Promote(ctx); err != nil {
		return "", err
	}
	promote := time.Since(t0)
	c.proxy.SetTarget(net.JoinHostPort("127.0.0.1", strconv.Itoa(st.Port())))
	n := c.proxy.Cut()
	c.mu.Lock()
	c.primary, c.standby = st, nil
	c.n++
	c.mu.Unlock()
	_ = p.Close()
	if err := c.addStandby(context.WithoutCancel(ctx)); err != nil {
		return "", fmt.Errorf("new standby: %w", err)
	}
	return fmt.Sprintf("tail %v, promoted in %v, cut %d connections", tail.Round(time.Millisecond), promote.Round(time.Millisecond), n), nil
}

// configureSingleServer configures what the operator of a server without
// standbys would: promotion mode 'synchronous' (pg_lease 0.4.0), so that a
// kill fault's restart moves to the next epoch era without a grace (in mode
// 'any', no new grant for max_ttl after it). Without lease.configure(interval,
// text) it does nothing.
func configureSingleServer(ctx context.Context, conn *pgx.Conn) error {
	var has bool
	if err := conn.QueryRow(ctx, "SELECT to_regprocedure('lease.configure(interval,text)') IS NOT NULL").Scan(&has); err != nil || !has {
		return err
	}
	_, err := conn.Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')")
	return err
}

// configureGrace sets pg_lease's max_ttl (0.3.0: the TTL bound and the
// promotion grace) before any grant, and drops the grace kept for beliefs
// formed under the default max_ttl (no grant was ever made). Without
// lease.configure (before 0.3.0) it does nothing: the checker then finds
// what a failover breaks.
func configureGrace(ctx context.Context, conn *pgx.Conn, maxTTL time.Duration) error {
	var has bool
	if err := conn.QueryRow(ctx, "SELECT (to_regprocedure('lease.configure(interval)') IS NOT NULL OR to_regprocedure('lease.configure(interval,text)') IS NOT NULL)").Scan(&has); err != nil || !has {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT lease.configure(max_ttl => $1::interval)", fmt.Sprintf("%d milliseconds", maxTTL.Milliseconds())); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, "UPDATE lease.settings SET prev_max_ttl = NULL, prev_until = NULL")
	return err
}

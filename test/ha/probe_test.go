package ha

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/patroni"
)

// probeEvery is how often each node is asked whether it accepts writes: the
// precision of the promotion instants measured.
const probeEvery = 25 * time.Millisecond

// promotion is a node first seen accepting writes (pg_is_in_recovery()
// false) after it did not.
type promotion struct {
	node *patroni.Node
	at   time.Time
}

// probe asks every node, every probeEvery, whether it is a primary, and
// records when a node becomes one.
type probe struct {
	mu      sync.Mutex
	primary map[string]bool
	events  []promotion
}

func startProbe(w *world) *probe {
	p := &probe{primary: map[string]bool{}}
	for _, n := range w.c.Nodes() {
		w.wg.Go(func() { p.run(w.runCtx, n) })
	}
	return p
}

func (p *probe) run(ctx context.Context, n *patroni.Node) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := n.Connect(cctx, "postgres")
			cancel()
			if err == nil {
				conn = c
			}
		}
		if conn != nil {
			qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			var rec bool
			err := conn.QueryRow(qctx, "SELECT pg_is_in_recovery()").Scan(&rec)
			at := time.Now()
			cancel()
			if err != nil {
				_ = conn.Close(context.Background())
				conn = nil
			} else {
				p.observe(n, !rec, at)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(probeEvery):
		}
	}
}

func (p *probe) observe(n *patroni.Node, primary bool, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was, seen := p.primary[n.Name]
	p.primary[n.Name] = primary
	if primary && seen && !was {
		p.events = append(p.events, promotion{node: n, at: at})
	}
}

// await waits for a promotion of a node other than old after the instant
// after.
func (p *probe) await(ctx context.Context, after time.Time, old *patroni.Node) (promotion, error) {
	for {
		p.mu.Lock()
		for _, e := range p.events {
			if e.node != old && e.at.After(after) {
				p.mu.Unlock()
				return e, nil
			}
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return promotion{}, fmt.Errorf("no node other than %s promoted: %w", old.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

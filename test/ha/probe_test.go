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
	// commit is when the first commit on the node returned: an insert sent
	// as soon as the promotion was seen (zero until then). In the
	// synchronous modes it waits for a standby to confirm it.
	commit chan time.Time
}

// replState is what the probe saw of a node's replication, each time it
// changed: synchronous_standby_names and how many standbys stream from it.
type replState struct {
	at        time.Time
	primary   bool
	syncNames string
	streaming int
}

// probe asks every node, every probeEvery, whether it is a primary (and
// how its replication stands), and records when a node becomes one.
type probe struct {
	ctx     context.Context
	mu      sync.Mutex
	primary map[string]bool
	events  []promotion
	repl    map[string][]replState
}

func startProbe(w *world) *probe {
	p := &probe{ctx: w.runCtx, primary: map[string]bool{}, repl: map[string][]replState{}}
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
			var rs replState
			var rec bool
			err := conn.QueryRow(qctx, `SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
				(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming')`).Scan(&rec, &rs.syncNames, &rs.streaming)
			rs.at, rs.primary = time.Now(), !rec
			cancel()
			if err != nil {
				_ = conn.Close(context.Background())
				conn = nil
			} else {
				p.observe(n, rs)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(probeEvery):
		}
	}
}

func (p *probe) observe(n *patroni.Node, rs replState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was, seen := p.primary[n.Name]
	p.primary[n.Name] = rs.primary
	if rs.primary && seen && !was {
		e := promotion{node: n, at: rs.at, commit: make(chan time.Time, 1)}
		p.events = append(p.events, e)
		go p.firstCommit(e)
	}
	h := p.repl[n.Name]
	if l := len(h); l == 0 || h[l-1].primary != rs.primary || h[l-1].syncNames != rs.syncNames || h[l-1].streaming != rs.streaming {
		p.repl[n.Name] = append(h, rs)
	}
}

// firstCommit sends one insert to a node just promoted and reports when
// its commit returned (zero if none did within 10 s).
func (p *probe) firstCommit(e promotion) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	var at time.Time
	defer func() { e.commit <- at }()
	for ctx.Err() == nil {
		conn, err := e.node.Connect(ctx, dbName)
		if err == nil {
			_, err = conn.Exec(ctx, `INSERT INTO ha_probe DEFAULT VALUES`)
			at = time.Now()
			_ = conn.Close(context.Background())
			if err == nil {
				return
			}
		}
		at = time.Time{}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// replSince returns the replication states of node seen from the last one
// before at on.
func (p *probe) replSince(node string, at time.Time) []replState {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.repl[node]
	i := 0
	for j, rs := range h {
		if !rs.at.After(at) {
			i = j
		}
	}
	return append([]replState(nil), h[i:]...)
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

// awaitDemotion waits until node, a primary, is seen in recovery after
// the instant after, and returns when.
func (p *probe) awaitDemotion(ctx context.Context, node *patroni.Node, after time.Time) (time.Time, error) {
	for {
		p.mu.Lock()
		for _, rs := range p.repl[node.Name] {
			if rs.at.After(after) && !rs.primary {
				p.mu.Unlock()
				return rs.at, nil
			}
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s not seen in recovery: %w", node.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// last returns node's latest promotion seen after the instant after.
func (p *probe) last(node *patroni.Node, after time.Time) (promotion, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.events) - 1; i >= 0; i-- {
		if e := p.events[i]; e.node == node && e.at.After(after) {
			return e, true
		}
	}
	return promotion{}, false
}

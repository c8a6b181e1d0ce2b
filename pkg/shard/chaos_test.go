package shard_test

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/shard"
)

// TestChaosTenReplicas: 10 replicas and 1,024 shards on one database (TTL
// 10 s), then joins, leaves and crashes at random (restarts of a crashed
// identity among the joins), back to back; at the end the live replicas own every
// shard, balanced, and no two replicas ever acted under one shard at once.
// It logs the statements per second the settled replicas cost. Between
// settled states it logs the shards moved against the fewest that the
// endpoints need: with four changes between two settled states (a member
// that joined and crashed in between), more must move than that.
func TestChaosTenReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("minutes: 10 replicas, 1,024 shards")
	}
	const replicas, shards, steps = 10, 1024, 16
	// The default TTL: on a host at load average 50, a renewal of 100 keys
	// can take seconds.
	c := newCluster(t, shards, 10*time.Second)
	stmts := &stmtCounter{n: map[string]int{}}
	c.poolOpts = []pgtest.PoolOption{func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = stmts }}
	var live, crashed []string
	next := 0
	join := func(id string) {
		if id == "" {
			id = "r" + strconv.Itoa(next)
			next++
		}
		c.start(id)
		live = append(live, id)
	}
	for range replicas {
		join("")
	}
	t.Logf("%d replicas: settled in %v", replicas, c.waitSettled(live...))
	c.statementRate(live, stmts)

	rnd := rand.New(rand.NewPCG(37, 1))
	var joins, leaves, crashes, restarts int
	for i := range steps {
		switch k := rnd.IntN(3); {
		case len(live) < replicas-2 || (k == 0 && len(live) < replicas+2):
			if len(crashed) > 0 && rnd.IntN(2) == 0 {
				join(crashed[0])
				crashed = crashed[1:]
				restarts++
			} else {
				join("")
				joins++
			}
		case k == 1:
			j := rnd.IntN(len(live))
			rep := c.replicas[live[j]]
			rep.cancel(context.Canceled)
			<-rep.done
			live = slices.Delete(live, j, j+1)
			leaves++
		default:
			j := rnd.IntN(len(live))
			c.replicas[live[j]].cancel(shard.ErrCrash)
			crashed = append(crashed, live[j])
			live = slices.Delete(live, j, j+1)
			crashes++
		}
		if i%4 == 3 {
			t.Logf("step %d, %d live: settled in %v", i+1, len(live), c.waitSettled(live...))
		}
	}
	t.Logf("chaos: %d steps, %d joins, %d restarts, %d leaves, %d crashes; %d live settled in %v",
		steps, joins, restarts, leaves, crashes, len(live), c.waitSettled(live...))
	c.checkNoOverlap()
}

// statementRate logs, over three renewal periods of the settled replicas,
// how many statements of each kind they sent per second (counted by their
// pools' tracer).
func (c *cluster) statementRate(live []string, n *stmtCounter) {
	before, at := n.snapshot(), time.Now()
	time.Sleep(c.ttl) // a measurement window, not a wait for an outcome
	after, d := n.snapshot(), time.Since(at).Seconds()
	total := 0.0
	for _, f := range stmtKinds {
		r := float64(after[f]-before[f]) / d
		total += r
		c.t.Logf("%d replicas, %d shards, ttl %v: %s %.2f statements/s", len(live), c.n, c.ttl, f, r)
	}
	c.t.Logf("%d replicas, %d shards, ttl %v: %.2f statements/s in all", len(live), c.n, c.ttl, total)
}

// stmtKinds are the statements a replica sends, by the pg_lease function
// each calls (the first named in its text), "other" for the rest.
var stmtKinds = []string{"renew_many", "list", "candidate", "acquire", "release", "other"}

// stmtCounter counts the statements of the replicas' pools.
type stmtCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (n *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	kind := "other"
	for _, f := range stmtKinds[:len(stmtKinds)-1] {
		if strings.Contains(d.SQL, "lease."+f+"(") || strings.Contains(d.SQL, "lease."+f+"_many(") {
			kind = f
			break
		}
	}
	n.mu.Lock()
	n.n[kind]++
	n.mu.Unlock()
	return ctx
}

func (n *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (n *stmtCounter) snapshot() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.n)
}

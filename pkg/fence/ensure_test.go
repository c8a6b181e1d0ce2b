package fence_test

import (
	"fmt"

	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/fence"
)

// TestEnsureTableRace: replicas that start together each create the guard's
// table; every one of them succeeds. CREATE TABLE IF NOT EXISTS does not
// cover the race: a loser fails on whichever catalog entry (the table, its
// row type, its index) the winner committed first.
func TestEnsureTableRace(t *testing.T) {
	const replicas, rounds = 8, 200
	dsn := pgtest.NewDatabase(t)
	conns := make([]*pgx.Conn, replicas)
	for i := range conns {
		conns[i] = pgtest.Connect(t, dsn)
	}
	guards := make([]*fence.PGGuard, replicas)
	for round := range rounds {
		// A minute per round, a bound on a hang: the whole run's length
		// depends on the machine's load.
		ctx := testCtx(t)
		for i := range guards {
			g, err := fence.NewPGGuard(conns[i], fence.PGGuardOptions{Table: fmt.Sprintf("race_%d", round)})
			if err != nil {
				t.Fatal(err)
			}
			guards[i] = g
		}
		start := make(chan struct{})
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for i, g := range guards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = g.EnsureTable(ctx)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, replica %d: %v", round, i, err)
			}
		}
	}
}

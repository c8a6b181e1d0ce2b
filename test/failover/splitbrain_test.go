package failover

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestSplitBrainGuards: the old primary keeps running after the promotion,
// with its clients still on it, while the promoted standby serves others:
// two servers grant the same key at once. On the old primary one holder
// keeps the key; on the promoted server two take turns. Every holder writes
// through a
// fence.PGGuard on a third server (the shared test server) and through
// fence.InTx in its own side's database. The key was last released on the
// replayed timeline, then granted on the old primary only (the standby had
// been cut off): the promoted server's first grant is the one the old
// primary's was. The guard never accepts a lower epoch after a higher one,
// and never accepts one epoch from two owners; each side's fenced writes
// never go back either.
func TestSplitBrainGuards(t *testing.T) {
	const ttl = time.Second
	_, p, st := newPair(t, 2*ttl)
	ctx := pgtest.Context(t, 3*time.Minute)

	guardPool := pgtest.NewPool(t, pgtest.NewDatabase(t), pgtest.MaxConns(8))
	guard, err := fence.NewPGGuard(guardPool, fence.PGGuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := guardPool.Exec(ctx, "CREATE TABLE writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL, owner text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	oldPool := pool(t, dsn(p))
	if _, err := oldPool.Exec(ctx, "CREATE TABLE side_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL, owner text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	old := lease.New(oldPool)
	g0, ok, err := old.Acquire(ctx, "res", "x0", ttl)
	if err != nil || !ok {
		t.Fatalf("first acquire: %v %v", ok, err)
	}
	if err := old.Release(ctx, g0.Token); err != nil {
		t.Fatal(err)
	}
	cutOff(t, ctx, p, st)

	var accepted, rejected atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	// holder campaigns on one side and, while it holds, writes through the
	// guard and through fence.InTx on its side, renewing between writes;
	// rounds writes (and renewals) per grant, then releases (0: keeps the
	// grant, renewing, until the end).
	holder := func(owner string, side *pgxpool.Pool, rounds int, firstGrant chan<- lease.Grant) {
		cl := lease.New(side)
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := opCtx(5 * time.Second)
			g, ok, err := cl.Acquire(cctx, "res", owner, ttl)
			if err == nil && ok {
				if firstGrant != nil {
					firstGrant <- g
					firstGrant = nil
				}
			writing:
				for i := 0; rounds == 0 || i < rounds; i++ {
					select {
					case <-stop:
						break writing
					default:
					}
					werr := guard.Write(cctx, g.Token, func(tx pgx.Tx) error {
						_, err := tx.Exec(cctx, "INSERT INTO writes (epoch, owner) VALUES ($1, $2)", g.Epoch, owner)
						return err
					})
					switch {
					case werr == nil:
						accepted.Add(1)
					case errors.Is(werr, fence.ErrStale):
						rejected.Add(1)
					default:
						err = werr
					}
					if ferr := fence.InTx(cctx, side, g.Token, func(tx pgx.Tx) error {
						_, err := tx.Exec(cctx, "INSERT INTO side_writes (epoch, owner) VALUES ($1, $2)", g.Epoch, owner)
						return err
					}); ferr != nil && !errors.Is(ferr, fence.ErrStale) {
						err = ferr
					}
					if g, err = cl.Renew(cctx, g.Token, ttl); err != nil {
						break
					}
					cancel()
					cctx, cancel = opCtx(5 * time.Second)
					time.Sleep(20 * time.Millisecond)
				}
				_ = cl.Release(cctx, g.Token)
			}
			cancel()
			if err != nil && !errors.Is(err, lease.ErrLost) {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", owner, err))
				errMu.Unlock()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// On the old primary one holder keeps the key (epoch E, the first
	// grant after the cut), renewing and writing until the end.
	oldFirst := make(chan lease.Grant, 1)
	wg.Go(func() { holder("x1", oldPool, 0, oldFirst) })
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	var xg lease.Grant
	select {
	case xg = <-oldFirst:
	case <-ctx.Done():
		t.Fatal("no grant on the old primary")
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	newPool := pool(t, dsn(st))
	newFirst := make(chan lease.Grant, 1)
	for _, o := range []string{"y1", "y2"} {
		var ch chan<- lease.Grant
		if o == "y1" {
			ch = newFirst
		}
		wg.Go(func() { holder(o, newPool, 3, ch) })
	}
	var yg lease.Grant
	select {
	case yg = <-newFirst:
	case <-time.After(30 * time.Second):
		t.Fatal("no grant on the promoted server within 30 s")
	}
	t.Logf("old primary's first grant after the cut: epoch %d; promoted server's first grant (y1): epoch %d, %v after the promotion",
		xg.Epoch, yg.Epoch, time.Since(promoted).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // both sides hold and write
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Log(err)
	}

	type w struct {
		Epoch int64
		Owner string
	}
	read := func(q *pgxpool.Pool, table string) []w {
		rows, err := q.Query(ctx, "SELECT epoch, owner FROM "+table+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		ws, err := pgx.CollectRows(rows, pgx.RowToStructByPos[w])
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	check := func(where string, ws []w) {
		var v []string
		owner := map[int64]string{}
		for i, x := range ws {
			if i > 0 && x.Epoch < ws[i-1].Epoch {
				v = append(v, fmt.Sprintf("%s: write %d accepted epoch %d (%s) after epoch %d (%s)", where, i, x.Epoch, x.Owner, ws[i-1].Epoch, ws[i-1].Owner))
			}
			if o, ok := owner[x.Epoch]; ok && o != x.Owner {
				v = append(v, fmt.Sprintf("%s: write %d accepted epoch %d from %s after accepting it from %s", where, i, x.Epoch, x.Owner, o))
			}
			owner[x.Epoch] = x.Owner
		}
		report(t, v)
	}
	gw := read(guardPool, "writes")
	bySide := map[byte]int{}
	for _, x := range gw {
		bySide[x.Owner[0]]++
	}
	t.Logf("guard: %d writes accepted (%d from the old side, %d from the new), %d rejected as stale", accepted.Load(), bySide['x'], bySide['y'], rejected.Load())
	if bySide['y'] == 0 {
		t.Error("the guard accepted no write from the promoted side")
	}
	check("guard on the third server", gw)
	check("fence.InTx on the old primary", read(oldPool, "side_writes"))
	check("fence.InTx on the promoted server", read(newPool, "side_writes"))
}

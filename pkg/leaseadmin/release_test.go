package leaseadmin_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestForceRelease: ForceRelease ends the current grant on a pool, on a
// single connection and inside the caller's transaction, moves the epoch
// past it, fences the former holder, and is a no-op on a free key.
func TestForceRelease(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		kinds := []struct {
			name string
			run  func(t *testing.T, f func(q lease.Querier))
		}{
			{"pool", func(t *testing.T, f func(lease.Querier)) { f(db.pool) }},
			{"conn", func(t *testing.T, f func(lease.Querier)) { f(connect(t, db.dsn)) }},
			{"tx", func(t *testing.T, f func(lease.Querier)) {
				tx, err := db.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				f(tx)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}},
		}
		for _, k := range kinds {
			t.Run(k.name, func(t *testing.T) {
				key := "force/" + k.name
				k.run(t, func(q lease.Querier) {
					c := lease.New(q)
					g, ok, err := c.Acquire(ctx, key, "bob", time.Minute)
					if err != nil || !ok || g.Epoch != 1 {
						t.Fatalf("Acquire: %+v, %v, %v", g, ok, err)
					}
					released, prev, epoch, err := leaseadmin.ForceRelease(ctx, c, key)
					if err != nil || !released || prev != "bob" || epoch != 2 {
						t.Fatalf("ForceRelease: %v %q %d %v", released, prev, epoch, err)
					}
					released, prev, epoch, err = leaseadmin.ForceRelease(ctx, c, key)
					if err != nil || released || prev != "" || epoch != 2 {
						t.Fatalf("ForceRelease of a free key: %v %q %d %v", released, prev, epoch, err)
					}
					if _, err := c.Renew(ctx, g.Token, time.Minute); !errors.Is(err, lease.ErrNotOwner) {
						t.Fatalf("Renew after ForceRelease: %v, want ErrNotOwner", err)
					}
				})
				// Whatever ran in the transaction is visible after commit.
				st, err := db.c.Inspect(ctx, key)
				if err != nil || !st.Exists || st.Held || st.Epoch != 2 {
					t.Fatalf("after ForceRelease: %+v, %v, want an existing free key with epoch counter 2", st, err)
				}
			})
		}

		// An invalid key is refused by the server with DETAIL.
		_, _, _, err := leaseadmin.ForceRelease(ctx, db.c, "")
		var pgErr *pgconn.PgError
		if !errors.Is(err, lease.ErrInvalidInput) || !errors.As(err, &pgErr) || pgErr.Detail == "" {
			t.Errorf("ForceRelease(\"\"): %v, want ErrInvalidInput with DETAIL", err)
		}
	})
}

// TestForceReleaseNotInstalled: on a database without pg_lease,
// ForceRelease and Cleanup say ErrNotInstalled.
func TestForceReleaseNotInstalled(t *testing.T) {
	ctx := testCtx(t)
	c := lease.New(newPool(t, pgtest.NewDatabase(t)))
	if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "k"); !errors.Is(err, lease.ErrNotInstalled) {
		t.Errorf("ForceRelease: %v, want ErrNotInstalled", err)
	}
	if _, _, err := leaseadmin.Cleanup(ctx, c, 0, 10); !errors.Is(err, lease.ErrNotInstalled) {
		t.Errorf("Cleanup: %v, want ErrNotInstalled", err)
	}
}

// TestCleanup: Cleanup, the Go wrapper of lease.cleanup, removes free keys, raises the
// floor, and is an operator's call (ErrPermission for other roles).
func TestCleanup(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		g, _, err := db.c.Acquire(ctx, "old", "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.c.Acquire(ctx, "held", "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		removed, floor, err := leaseadmin.Cleanup(ctx, db.c, 0, 10)
		if err != nil || removed != 1 || floor < g.Epoch+1 {
			t.Fatalf("Cleanup: removed %d, floor %d, %v (released epoch %d)", removed, floor, err, g.Epoch)
		}
		if s, _ := db.c.Inspect(ctx, "old"); s.Exists {
			t.Fatalf("old still there: %+v", s)
		}
		for _, bad := range []struct {
			freeFor time.Duration
			max     int
		}{{-time.Second, 1}, {0, 0}, {0, 1 << 40}} {
			if _, _, err := leaseadmin.Cleanup(ctx, db.c, bad.freeFor, bad.max); !errors.Is(err, lease.ErrInvalidInput) {
				t.Errorf("Cleanup(%v, %d): %v, want ErrInvalidInput", bad.freeFor, bad.max, err)
			}
		}

		tx, err := db.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `CREATE ROLE lease_nobody; SET LOCAL ROLE lease_nobody`); err != nil {
			t.Fatal(err)
		}
		if _, _, err := leaseadmin.Cleanup(ctx, lease.New(tx), 0, 10); !errors.Is(err, lease.ErrPermission) {
			t.Fatalf("Cleanup by a role without EXECUTE: %v, want ErrPermission", err)
		}
	})
}

package lease_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// newCollatedLeaseDB creates a database whose default collation orders
// text otherwise than bytes (ICU en-US from PostgreSQL 15, else a libc
// en_US locale when the server has one), installs pg_lease in it, and
// returns its DSN. It fails, naming what to install, when the server offers
// no such collation: the test would otherwise prove nothing.
func newCollatedLeaseDB(t *testing.T) string {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	pgtest.SharedExtensionFiles(t)
	s := pgtest.Shared(t)
	admin := pgtest.Connect(t, s.DSN())
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := fmt.Sprintf("pgtest_%d_collated_%s", os.Getpid(), hex.EncodeToString(r[:]))
	var tried []string
	created := false
	for _, opts := range []string{
		"LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C' ENCODING 'UTF8'",
		"LOCALE 'en_US.UTF-8' ENCODING 'UTF8'",
		"LOCALE 'en_US.utf8' ENCODING 'UTF8'",
	} {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0 "+opts)
		if err == nil {
			created = true
			break
		}
		tried = append(tried, fmt.Sprintf("%s: %v", opts, err))
	}
	if !created {
		t.Fatalf("no collation other than byte order on this server: %q; use a PostgreSQL built with ICU (Debian's postgresql-15 is), or install the en_US.UTF-8 locale (apt-get install locales; locale-gen en_US.UTF-8) and restart the test", tried)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	dsn := s.DatabaseDSN(name)
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// TestBatchesLockInByteOrder: under a collation that orders the keys
// otherwise than bytes ('_x' < 'a' < 'B' in en-US, 'B' < '_x' < 'a' in
// bytes), a ReleaseMany and a renew_many batch (RenewTerms' statement) over
// the same keys never deadlock: both lock in byte order. The ReleaseMany
// waits first, at 'B' (the first key in byte order), for a fence left open;
// the batch then queues behind it. Had the batch locked in the database's
// collation order, it would hold '_x' and 'a' while waiting for 'B', and the
// release, once it had 'B', would wait for '_x': 40P01.
func TestBatchesLockInByteOrder(t *testing.T) {
	dsn := newCollatedLeaseDB(t)
	ctx := testCtx(t)
	keys := []string{"a", "B", "_x"}

	var collated []string
	if err := pgtest.Connect(t, dsn).QueryRow(ctx,
		`SELECT array_agg(k ORDER BY k) FROM unnest($1::text[]) k`, keys).Scan(&collated); err != nil {
		t.Fatal(err)
	}
	bytewise := slices.Clone(keys)
	slices.Sort(bytewise)
	if slices.Equal(collated, bytewise) {
		t.Fatalf("the database orders %q as bytes do (%q): the test needs another order", keys, collated)
	}

	named := func(app string) pgtest.PoolOption {
		return func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app }
	}
	pool := newPool(t, dsn)
	c := lease.New(pool)
	releaser := lease.New(pgtest.NewPool(t, dsn, named("pglease-test-release")))
	renewer := lease.New(pgtest.NewPool(t, dsn, named("pglease-test-renew")))
	var ts []lease.Token
	for _, k := range keys {
		g, ok, err := c.Acquire(ctx, k, "o", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire %q: %v %v", k, ok, err)
		}
		ts = append(ts, g.Token)
	}

	fence := pgtest.Connect(t, dsn)
	tx, err := fence.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT lease.fence($1, $2, $3)`, ts[1].Key, ts[1].Owner, ts[1].Epoch); err != nil {
		t.Fatal(err)
	}

	waiting := func(app string) func() bool {
		return func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
			return err == nil && n > 0
		}
	}
	type released struct {
		errs []error
		err  error
	}
	relDone := make(chan released, 1)
	go func() {
		errs, err := releaser.ReleaseMany(ctx, ts)
		relDone <- released{errs, err}
	}()
	pgtest.Eventually(t, time.Minute, "the ReleaseMany to wait for the fenced key", waiting("pglease-test-release"))

	type renewed struct {
		res []lease.RenewResult
		err error
	}
	renDone := make(chan renewed, 1)
	go func() {
		rev := slices.Clone(ts)
		slices.Reverse(rev)
		res, err := renewer.RenewMany(ctx, rev, time.Minute)
		renDone <- renewed{res, err}
	}()
	pgtest.Eventually(t, time.Minute, "the renew_many batch to wait", waiting("pglease-test-renew"))

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rel, ren := <-relDone, <-renDone
	var pgErr *pgconn.PgError
	for _, err := range []error{rel.err, ren.err} {
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			t.Errorf("deadlock: %v", err)
		} else if err != nil {
			t.Errorf("batch failed: %v", err)
		}
	}
	if rel.err == nil {
		for i, err := range rel.errs {
			if err != nil {
				t.Errorf("release %v: %v", ts[i], err)
			}
		}
	}
	// The release went first (it queued first at 'B'): every key was free
	// when the batch decided.
	if ren.err == nil {
		for _, r := range ren.res {
			if !errors.Is(r.Err, lease.ErrNotOwner) {
				t.Errorf("renew %v after the release: %v, want not_owner", r.Token, r.Err)
			}
		}
	}
}

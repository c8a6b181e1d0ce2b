package fence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestPGGuardIdentifiersAsInSQL: the table and column names of
// PGGuardOptions mean what they mean in a SQL statement: unquoted names are
// folded to lower case (Jobs finds the table created by CREATE TABLE Jobs),
// double-quoted ones are exact, and a dot inside quotes is part of the name.
func TestPGGuardIdentifiersAsInSQL(t *testing.T) {
	pool := newPool(t, false)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA App;
		CREATE TABLE App.Jobs (Id text PRIMARY KEY, State text, Fence_Epoch bigint);
		INSERT INTO App.Jobs VALUES ('j1', 'new', NULL);
		CREATE TABLE "Mixed.Case" ("Res" text PRIMARY KEY, "Ep""och" bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// Unquoted, mixed case, as the table was written in CREATE TABLE.
	for _, o := range []fence.PGGuardOptions{
		{Table: "App.Jobs", ResourceColumn: "Id", EpochColumn: "Fence_Epoch", OwnRows: true},
		{Table: "APP.JOBS", ResourceColumn: "ID", EpochColumn: "FENCE_EPOCH", OwnRows: true},
		{Table: `"app"."jobs"`, ResourceColumn: `"id"`, EpochColumn: `"fence_epoch"`, OwnRows: true},
	} {
		g, err := fence.NewPGGuard(pool, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		var epoch int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(fence_epoch, 0) + 2 FROM app.jobs WHERE id = 'j1'").Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		if err := g.WriteResource(ctx, "j1", lease.Token{Key: "jobs", Owner: "a", Epoch: epoch}, nil); err != nil {
			t.Fatalf("%+v: write at epoch %d: %v", o, epoch, err)
		}
		if err := g.WriteResource(ctx, "j1", lease.Token{Key: "jobs", Owner: "a", Epoch: epoch - 1}, nil); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("%+v: lower epoch: %v", o, err)
		}
		if got, err := fence.Epoch(g, ctx, "j1"); err != nil || got != epoch {
			t.Fatalf("%+v: Epoch = %d, %v; want %d", o, got, err, epoch)
		}
	}

	// Quoted: exact, with a dot and a doubled quote inside.
	g, err := fence.NewPGGuard(pool, fence.PGGuardOptions{Table: `"Mixed.Case"`, ResourceColumn: `"Res"`, EpochColumn: `"Ep""och"`})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Write(ctx, lease.Token{Key: "r", Owner: "a", Epoch: 4}, nil); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT "Ep""och" FROM "Mixed.Case" WHERE "Res" = 'r'`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("quoted table: epoch %d, %v", n, err)
	}

	// The same letters unquoted are another name: schema mixed, table case.
	g, err = fence.NewPGGuard(pool, fence.PGGuardOptions{Table: "Mixed.Case", ResourceColumn: `"Res"`, EpochColumn: `"Ep""och"`})
	if err != nil {
		t.Fatal(err)
	}
	var pg *pgconn.PgError
	if err := g.Write(ctx, lease.Token{Key: "r", Owner: "a", Epoch: 5}, nil); !errors.As(err, &pg) || pg.Code != "42P01" ||
		!strings.Contains(pg.Message, `"mixed.case"`) {
		t.Fatalf("unquoted Mixed.Case: %v, want relation \"mixed.case\" does not exist (42P01)", err)
	}

	// EnsureTable creates what CREATE TABLE NewEpochs would: newepochs.
	g, err = fence.NewPGGuard(pool, fence.PGGuardOptions{Table: "NewEpochs", ResourceColumn: "Resource", EpochColumn: "Epoch"})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	var cols []string
	rows, err := pool.Query(ctx, `SELECT attname FROM pg_attribute
		WHERE attrelid = 'public.newepochs'::regclass AND attnum > 0 ORDER BY attnum`)
	if err != nil {
		t.Fatal(err)
	}
	if cols, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cols, ",") != "resource,epoch,updated_at" {
		t.Fatalf("EnsureTable created columns %v", cols)
	}
}

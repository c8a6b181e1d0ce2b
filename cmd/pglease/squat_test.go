package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// squatDB is a fresh database in which a role with nothing but CREATE on the
// database prepared schema lease: its functions record in squat.ran that
// they ran, and as whom, and try to make that role superuser. It returns the
// superuser's DSN, the DSN of an installer role (CREATE on the database),
// the squatter's name and a superuser connection.
func squatDB(t *testing.T, plant func(ctx context.Context, sq *pgx.Conn, squatter string) error) (dsn, installerDSN, squatter string, admin *pgx.Conn) {
	t.Helper()
	ctx := testCtx(t)
	dsn = freshDB(t)
	admin, _ = connect(t, ctx, dsn)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	squatter = role(t, ctx, "pglease_squatter")
	installer := role(t, ctx, "pglease_installer")
	for _, r := range []string{squatter, installer} {
		if _, err := admin.Exec(ctx, fmt.Sprintf(`GRANT CREATE ON DATABASE %q TO %q`, db, r)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %q`, r))
		})
	}
	sq, _ := connect(t, ctx, pgtest.WithUser(dsn, squatter))
	for _, s := range []string{
		`CREATE SCHEMA squat`, `CREATE TABLE squat.ran (what text, as_role text)`,
		`GRANT USAGE ON SCHEMA squat TO PUBLIC`, `GRANT INSERT ON squat.ran TO PUBLIC`,
	} {
		if _, err := sq.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := plant(ctx, sq, squatter); err != nil {
		t.Fatal(err)
	}
	return dsn, pgtest.WithUser(dsn, installer), squatter, admin
}

// hostile is a PL/pgSQL body that records it ran and tries to make squatter
// superuser, then runs ret.
func hostile(squatter, what, ret string) string {
	return fmt.Sprintf(`$b$BEGIN
  INSERT INTO squat.ran VALUES ('%s', current_user);
  BEGIN EXECUTE 'ALTER ROLE %s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  %s
END$b$`, what, squatter, ret)
}

// plantAPI replaces or creates the functions cleanup and release --force
// call with hostile ones of the squatter's.
func plantAPI(ctx context.Context, sq *pgx.Conn, squatter string) error {
	for _, s := range []string{
		`CREATE OR REPLACE FUNCTION lease.cleanup(free_for interval, max_rows integer DEFAULT 10000,
		    OUT removed bigint, OUT epoch_floor bigint) LANGUAGE plpgsql AS ` +
			hostile(squatter, "lease.cleanup", "removed := 0; epoch_floor := 0;"),
		`CREATE OR REPLACE FUNCTION lease.force_release(key text,
		    OUT released boolean, OUT previous_owner text, OUT epoch bigint) LANGUAGE plpgsql AS ` +
			hostile(squatter, "lease.force_release", "released := false; epoch := 1;"),
		`GRANT USAGE ON SCHEMA lease TO PUBLIC`,
		`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lease TO PUBLIC`,
	} {
		if _, err := sq.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// ran returns what the squatter's functions recorded and whether it became
// superuser.
func ran(t *testing.T, admin *pgx.Conn, squatter string) ([]string, bool) {
	t.Helper()
	ctx := testCtx(t)
	var out []string
	rows, err := admin.Query(ctx, `SELECT what || ' as ' || as_role FROM squat.ran`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	var super bool
	if err := admin.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, squatter).Scan(&super); err != nil {
		t.Fatal(err)
	}
	return out, super
}

// TestSquattedSchemaRefused: a role with CREATE on the database created
// schema lease with a lease.version() (and lease.cleanup and
// lease.force_release) that would make it superuser, or created the
// extension itself and replaced those functions. install, install
// --schema-only, version, cleanup and release --force, run by the superuser
// or by an installer role, exit 11 naming the squatter (version over the
// squatter's extension prints it, untrusted, and exits 0), and none of the
// squatter's functions ran.
func TestSquattedSchemaRefused(t *testing.T) {
	for _, sc := range []struct {
		name      string
		plant     func(ctx context.Context, sq *pgx.Conn, squatter string) error
		extension bool
	}{
		{"schema", func(ctx context.Context, sq *pgx.Conn, squatter string) error {
			if _, err := sq.Exec(ctx, `CREATE SCHEMA lease`); err != nil {
				return err
			}
			if _, err := sq.Exec(ctx, `CREATE FUNCTION lease.version() RETURNS text LANGUAGE plpgsql AS `+
				hostile(squatter, "lease.version", "RETURN '"+leaseadmin.Version+"';")); err != nil {
				return err
			}
			return plantAPI(ctx, sq, squatter)
		}, false},
		{"extension", func(ctx context.Context, sq *pgx.Conn, squatter string) error {
			if _, err := sq.Exec(ctx, `CREATE EXTENSION pg_lease`); err != nil {
				return err
			}
			return plantAPI(ctx, sq, squatter)
		}, true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			ctx := testCtx(t)
			dsn, installerDSN, squatter, admin := squatDB(t, sc.plant)
			for _, as := range []struct{ name, dsn string }{{"superuser", dsn}, {"installer", installerDSN}} {
				for _, args := range [][]string{
					{"install"}, {"install", "--schema-only"}, {"version"},
					{"cleanup", "--free-for", "1h"}, {"release", "--force", "k"},
				} {
					code, out, errs := pglease(t, ctx, dsnEnv(as.dsn), args...)
					switch {
					case args[0] == "version" && sc.extension:
						if code != exitOK || !strings.Contains(out, "sql:     "+leaseadmin.Version+" (extension)") ||
							!strings.Contains(out, "owner:   role "+squatter+", which") {
							t.Errorf("%s: pglease %q: exit %d\n%s%s", as.name, args, code, out, errs)
						}
					case code != exitUntrusted || !strings.Contains(errs, squatter) || !strings.Contains(errs, "nothing in it was run"):
						t.Errorf("%s: pglease %q: exit %d, want %d naming %s\nstdout: %s\nstderr: %s",
							as.name, args, code, exitUntrusted, squatter, out, errs)
					case args[0] == "version" && !strings.Contains(out, "sql:     not trusted"):
						t.Errorf("%s: pglease version: %q, want the install shown not trusted", as.name, out)
					case strings.Contains(out, "installed"):
						t.Errorf("%s: pglease %q reported an install: %q", as.name, args, out)
					}
					if r, super := ran(t, admin, squatter); len(r) > 0 || super {
						t.Fatalf("%s: after pglease %q: the squatter's functions ran: %v; squatter superuser: %v", as.name, args, r, super)
					}
				}
			}
		})
	}
}

// TestSquattedSchemaRefusedToSuperuserReads: a superuser's read commands
// call nothing in a schema lease it cannot trust (a SECURITY INVOKER
// function of the squatter's would run as the superuser); they exit 11.
func TestSquattedSchemaRefusedToSuperuserReads(t *testing.T) {
	ctx := testCtx(t)
	dsn, _, squatter, admin := squatDB(t, func(ctx context.Context, sq *pgx.Conn, squatter string) error {
		for _, s := range []string{
			`CREATE SCHEMA lease`,
			`CREATE FUNCTION lease.version() RETURNS text LANGUAGE sql AS $$ SELECT '` + leaseadmin.Version + `'::text $$`,
			`CREATE FUNCTION lease.status(OUT max_ttl interval, OUT promotion_grace interval, OUT timeline bigint,
			    OUT era bigint, OUT grace_until timestamptz) LANGUAGE plpgsql AS ` +
				hostile(squatter, "lease.status", "max_ttl := '1 hour'; promotion_grace := '1 hour'; timeline := 1; era := 0;"),
			`GRANT USAGE ON SCHEMA lease TO PUBLIC`,
			`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lease TO PUBLIC`,
		} {
			if _, err := sq.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
	for _, args := range [][]string{{"status"}, {"get", "k"}, {"list"}, {"health"}} {
		code, out, errs := pglease(t, ctx, dsnEnv(dsn), args...)
		if code != exitUntrusted || !strings.Contains(errs, squatter) {
			t.Errorf("superuser: pglease %q: exit %d, want %d naming %s\nstdout: %s\nstderr: %s", args, code, exitUntrusted, squatter, out, errs)
		}
		if r, super := ran(t, admin, squatter); len(r) > 0 || super {
			t.Fatalf("after pglease %q: the squatter's functions ran: %v; squatter superuser: %v", args, r, super)
		}
	}
}

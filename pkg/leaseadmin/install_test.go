package leaseadmin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

func TestInstalled(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		v, ext, err := leaseadmin.Installed(ctx, db.pool)
		if err != nil || v != leaseadmin.Version || ext != db.mode.ext {
			t.Fatalf("Installed: %q %v %v, want %q %v", v, ext, err, leaseadmin.Version, db.mode.ext)
		}
		var comment string
		if err := db.pool.QueryRow(ctx, `SELECT obj_description('lease'::regnamespace, 'pg_namespace')`).Scan(&comment); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(comment, "schema-only"); got != !ext {
			t.Fatalf("schema comment %q in mode %s", comment, db.mode.name)
		}
	})
}

// TestInstallIdempotent: a second install of the same version, by either
// function, changes nothing, except that asking for the extension over a
// schema-only install is refused.
func TestInstallIdempotent(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		g, ok, err := db.c.Acquire(ctx, "survives", "alice", time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := db.mode.install(ctx, db.pool); err != nil {
			t.Fatalf("second %s install: %v", db.mode.name, err)
		}
		err = leaseadmin.InstallSchema(ctx, db.pool)
		if err != nil {
			t.Fatalf("InstallSchema over %s: %v", db.mode.name, err)
		}
		err = leaseadmin.InstallExtension(ctx, db.pool)
		if !db.mode.ext {
			if !errors.Is(err, leaseadmin.ErrModeMismatch) {
				t.Fatalf("InstallExtension over a schema-only install: %v, want ErrModeMismatch", err)
			}
		} else if err != nil {
			t.Fatalf("InstallExtension again: %v", err)
		}
		if _, ext, err := leaseadmin.Installed(ctx, db.pool); err != nil || ext != db.mode.ext {
			t.Fatalf("Installed after reinstalls: extension %v %v", ext, err)
		}
		if _, err := db.c.Renew(ctx, g.Token, time.Hour); err != nil {
			t.Fatalf("the lease did not survive the reinstalls: %v", err)
		}
	})
}

// TestInstallVersionMismatch: against another installed version both install
// functions refuse with ErrVersionMismatch and Installed reports it.
func TestInstallVersionMismatch(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		if db.mode.ext {
			// Pretend an older extension (superuser on a test server).
			if _, err := db.pool.Exec(ctx, `UPDATE pg_extension SET extversion = '0.0.9' WHERE extname = 'pg_lease'`); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, err := db.pool.Exec(ctx, `CREATE OR REPLACE FUNCTION lease.version() RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT '0.0.9'::text $$`); err != nil {
				t.Fatal(err)
			}
		}
		if v, ext, err := leaseadmin.Installed(ctx, db.pool); err != nil || v != "0.0.9" || ext != db.mode.ext {
			t.Fatalf("Installed: %q %v %v", v, ext, err)
		}
		if err := db.mode.install(ctx, db.pool); !errors.Is(err, leaseadmin.ErrVersionMismatch) {
			t.Fatalf("%s install over 0.0.9: %v, want ErrVersionMismatch", db.mode.name, err)
		}
		if err := leaseadmin.InstallSchema(ctx, db.pool); !errors.Is(err, leaseadmin.ErrVersionMismatch) {
			t.Fatalf("InstallSchema over 0.0.9 (%s): %v, want ErrVersionMismatch", db.mode.name, err)
		}
	})
}

// TestInstallConcurrent: installers racing on a fresh database all succeed
// and install once.
func TestInstallConcurrent(t *testing.T) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) {
			if m.ext {
				pgtest.SharedExtensionFiles(t)
			}
			dsn := pgtest.NewDatabase(t)
			ctx := testCtx(t)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				conn := connect(t, dsn)
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = m.install(ctx, conn)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("installer %d: %v", i, err)
				}
			}
			if v, ext, err := leaseadmin.Installed(ctx, connect(t, dsn)); err != nil || v != leaseadmin.Version || ext != m.ext {
				t.Fatalf("Installed: %q %v %v", v, ext, err)
			}
		})
	}
}

// TestInstallInCallerTx: the install joins the caller's transaction (as a
// savepoint) and goes with its rollback.
func TestInstallInCallerTx(t *testing.T) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) {
			if m.ext {
				pgtest.SharedExtensionFiles(t)
			}
			ctx := testCtx(t)
			pool := newPool(t, pgtest.NewDatabase(t))
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.install(ctx, tx); err != nil {
				t.Fatal(err)
			}
			if _, ext, err := leaseadmin.Installed(ctx, tx); err != nil || ext != m.ext {
				t.Fatalf("Installed inside the tx: %v %v", ext, err)
			}
			if _, ok, err := lease.New(tx).Acquire(ctx, "k", "a", time.Minute); err != nil || !ok {
				t.Fatalf("Acquire inside the tx: %v %v", ok, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, err := leaseadmin.Installed(ctx, pool); !errors.Is(err, lease.ErrNotInstalled) {
				t.Fatalf("Installed after rollback: %v, want ErrNotInstalled", err)
			}
		})
	}
}

// TestSchemaInstallByOrdinaryRole: the schema-only install is for roles
// that may not create extensions (pg_lease is trusted, but managed hosts
// allow-list extensions): an ordinary role with CREATE on its
// database installs it, owns every object, and other roles use the API but
// not the table nor force_release.
func TestSchemaInstallByOrdinaryRole(t *testing.T) {
	s := pgtest.Shared(t)
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	suffix := strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	installer, user := "lease_inst_"+suffix, "lease_user_"+suffix
	for _, r := range []string{installer, user} {
		if err := s.CreateRole(ctx, r, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"); err != nil {
			t.Fatal(err)
		}
	}
	admin := connect(t, dsn)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`GRANT CREATE ON DATABASE %q TO %q`, db, installer)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, r := range []string{installer, user} {
			_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %q`, r))
			_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %q`, r))
		}
	})

	inst := connect(t, pgtest.WithUser(dsn, installer))
	if err := leaseadmin.InstallSchema(ctx, inst); err != nil {
		t.Fatalf("InstallSchema as %s: %v", installer, err)
	}
	var owners []string
	rows, err := admin.Query(ctx, `SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc WHERE pronamespace = 'lease'::regnamespace
		UNION SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = 'lease'::regnamespace AND relkind = 'r'
		UNION SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'lease'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		_ = rows.Scan(&o)
		owners = append(owners, o)
	}
	if rows.Err() != nil || len(owners) != 1 || owners[0] != installer {
		t.Fatalf("owners %v (%v), want only %s", owners, rows.Err(), installer)
	}

	u := connect(t, pgtest.WithUser(dsn, user))
	c := lease.New(u)
	g, ok, err := c.Acquire(ctx, "k", "alice", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire as %s: %v %v", user, ok, err)
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Exec(ctx, `SELECT * FROM lease.leases`); err == nil {
		t.Fatal("an ordinary role read lease.leases")
	}
	if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "k"); err == nil {
		t.Fatal("an ordinary role ran force_release")
	}
}

// TestForeignLeaseSchema: a schema named lease that is not pg_lease's, even
// the installer's own, is not taken for an install, and neither installer
// overwrites it.
func TestForeignLeaseSchema(t *testing.T) {
	pgtest.SharedExtensionFiles(t)
	ctx := testCtx(t)
	pool := newPool(t, pgtest.NewDatabase(t))
	if _, err := pool.Exec(ctx, `CREATE SCHEMA lease`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := leaseadmin.Installed(ctx, pool); !errors.Is(err, leaseadmin.ErrSquatted) {
		t.Fatalf("Installed: %v, want ErrSquatted", err)
	}
	for name, install := range map[string]func(context.Context, interface {
		Begin(context.Context) (pgx.Tx, error)
	}) error{"InstallSchema": leaseadmin.InstallSchema, "InstallExtension": leaseadmin.InstallExtension} {
		if err := install(ctx, pool); !errors.Is(err, leaseadmin.ErrSquatted) || !strings.Contains(err.Error(), "not pg_lease's") {
			t.Fatalf("%s over a foreign schema: %v, want ErrSquatted", name, err)
		}
	}
}

// releasedChain lists the released scripts that make version v, in order:
// the full script of 0.1.0, then each released update script.
var releasedChain = []struct{ version, file string }{
	{"0.1.0", "pg_lease--0.1.0.sql"},
	{"0.2.0", "pg_lease--0.1.0--0.2.0.sql"},
	{"0.3.0", "pg_lease--0.2.0--0.3.0.sql"},
}

// installReleasedSchema installs released version v as a plain schema, the
// way a schema-only install of that version left it.
func installReleasedSchema(ctx context.Context, t *testing.T, conn *pgx.Conn, v string) {
	t.Helper()
	files := pgleasesql.Files()
	for _, r := range releasedChain {
		src := strings.ReplaceAll(string(files[r.file]), "@extowner@", "CURRENT_USER")
		src = src[strings.Index(src, "\\quit")+len("\\quit"):]
		if _, err := conn.Exec(ctx, src); err != nil {
			t.Fatalf("%s: %v", r.file, err)
		}
		if r.version == v {
			return
		}
	}
	t.Fatalf("no released version %s", v)
}

// TestInstallUpdatesOlderVersion: both installers take a database that has
// a released version to Version, through the direct update script, keeping
// every lease and its epoch; the updated install has the new objects.
func TestInstallUpdatesOlderVersion(t *testing.T) {
	for _, r := range releasedChain {
		for _, m := range installModes {
			t.Run(r.version+"/"+m.name, func(t *testing.T) {
				pgtest.SharedExtensionFiles(t)
				dsn := pgtest.NewDatabase(t)
				ctx := testCtx(t)
				conn := connect(t, dsn)
				if m.ext {
					if _, err := conn.Exec(ctx, `CREATE EXTENSION pg_lease VERSION '`+r.version+`'`); err != nil {
						t.Fatal(err)
					}
				} else {
					installReleasedSchema(ctx, t, conn, r.version)
				}
				c := lease.New(conn)
				g, ok, err := c.Acquire(ctx, "k", "o", time.Hour)
				if err != nil || !ok {
					t.Fatal(ok, err)
				}
				if v, _, err := leaseadmin.Installed(ctx, conn); err != nil || v != r.version {
					t.Fatalf("before: %q %v", v, err)
				}
				if err := m.install(ctx, conn); err != nil {
					t.Fatalf("%s install over %s: %v", m.name, r.version, err)
				}
				if v, ext, err := leaseadmin.Installed(ctx, conn); err != nil || v != leaseadmin.Version || ext != m.ext {
					t.Fatalf("after: %q %v %v", v, ext, err)
				}
				if s, err := c.Inspect(ctx, "k"); err != nil || !s.Held || s.Epoch != g.Epoch || !s.ExpiresAt.Equal(g.ExpiresAt) {
					t.Fatalf("lease after the update: %+v %v, grant %+v", s, err, g)
				}
				// The updated install has the new version's objects.
				var removed, floor int64
				if err := conn.QueryRow(ctx, `SELECT removed, epoch_floor FROM lease.cleanup('0')`).Scan(&removed, &floor); err != nil || removed != 0 {
					t.Fatalf("cleanup after the update: %d %d %v", removed, floor, err)
				}
				var listened int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT lease.listen('k')) l`).Scan(&listened); err != nil || listened != 1 {
					t.Fatalf("listen after the update: %d %v", listened, err)
				}
			})
		}
	}
}

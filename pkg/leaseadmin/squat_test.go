package leaseadmin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

var roleSeq atomic.Int64

// newRole creates a login role of the test's own on the shared server with
// CREATE on db's database when create is true, and drops it (and what it
// owns in db) at cleanup.
func newRole(t *testing.T, admin *pgx.Conn, prefix string, create bool) string {
	t.Helper()
	ctx := testCtx(t)
	name := fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e9, roleSeq.Add(1))
	if err := pgtest.Shared(t).CreateRole(ctx, name, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %q`, name))
		_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %q`, name))
	})
	if create {
		var db string
		if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf(`GRANT CREATE ON DATABASE %q TO %q`, db, name)); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(testCtx(t), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// hostileBody is a PL/pgSQL body that records that it ran, and as whom, and
// tries to make squatter a superuser: what a function in another role's
// schema lease does when a superuser or an installer calls it.
func hostileBody(squatter, what, ret string) string {
	return fmt.Sprintf(`BEGIN
  INSERT INTO squat.ran VALUES (%s, current_user);
  BEGIN EXECUTE 'ALTER ROLE %s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  %s
END`, quoteLit(what), squatter, ret)
}

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// plantRecorder creates, as the squatter, the table its functions record
// into (every role may insert).
func plantRecorder(t *testing.T, sq *pgx.Conn) {
	t.Helper()
	mustExec(t, sq, `CREATE SCHEMA squat`)
	mustExec(t, sq, `CREATE TABLE squat.ran (what text, as_role text)`)
	mustExec(t, sq, `GRANT USAGE ON SCHEMA squat TO PUBLIC`)
	mustExec(t, sq, `GRANT INSERT ON squat.ran TO PUBLIC`)
}

// plantHostileAPI replaces (or creates) lease.cleanup and lease.force_release
// with hostile functions owned by the squatter.
func plantHostileAPI(t *testing.T, sq *pgx.Conn, squatter string) {
	t.Helper()
	mustExec(t, sq, `CREATE OR REPLACE FUNCTION lease.cleanup(free_for interval, max_rows integer DEFAULT 10000,
	    OUT removed bigint, OUT epoch_floor bigint) LANGUAGE plpgsql AS $b$`+
		hostileBody(squatter, "lease.cleanup", "removed := 0; epoch_floor := 0;")+`$b$`)
	mustExec(t, sq, `CREATE OR REPLACE FUNCTION lease.force_release(key text,
	    OUT released boolean, OUT previous_owner text, OUT epoch bigint) LANGUAGE plpgsql AS $b$`+
		hostileBody(squatter, "lease.force_release", "released := true; previous_owner := 'x'; epoch := 1;")+`$b$`)
	mustExec(t, sq, `GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lease TO PUBLIC`)
}

// squats are the ways a role with nothing but CREATE on the database
// prepares schema lease before an operator installs or runs pg_lease. Each
// leaves functions that record when they run.
var squats = []struct {
	name string
	// plant runs as the squatter.
	plant func(t *testing.T, sq *pgx.Conn, squatter string)
	// extension: Installed reports the extension (its version comes from
	// pg_extension; nothing is called to learn it).
	extension bool
}{
	{"a schema with its own lease.version()", func(t *testing.T, sq *pgx.Conn, squatter string) {
		mustExec(t, sq, `CREATE SCHEMA lease`)
		mustExec(t, sq, `GRANT USAGE ON SCHEMA lease TO PUBLIC`)
		mustExec(t, sq, `CREATE FUNCTION lease.version() RETURNS text LANGUAGE plpgsql AS $b$`+
			hostileBody(squatter, "lease.version", "RETURN '"+leaseadmin.Version+"';")+`$b$`)
		plantHostileAPI(t, sq, squatter)
	}, false},
	{"a schema-only install of its own", func(t *testing.T, sq *pgx.Conn, squatter string) {
		if err := leaseadmin.InstallSchema(testCtx(t), sq); err != nil {
			t.Fatal(err)
		}
		plantHostileAPI(t, sq, squatter)
	}, false},
	{"the extension, created by the squatter", func(t *testing.T, sq *pgx.Conn, squatter string) {
		mustExec(t, sq, `CREATE EXTENSION pg_lease`) // trusted: CREATE on the database is enough
		plantHostileAPI(t, sq, squatter)             // it owns the extension's functions
	}, true},
}

// TestSquattedSchemaIsNeverCalled: a role with CREATE on the database
// prepares schema lease (its own schema, its own schema-only install, or
// the extension created by it) with functions that record that they ran and
// try to make it superuser. Then the superuser, and an installer role with
// CREATE on the database, run everything that installs or inspects
// pg_lease or that an operator runs: each refuses with ErrSquatted (Installed
// reports the squatter's extension, which it reads from pg_extension), no
// planted function runs, and the squatter gains nothing.
func TestSquattedSchemaIsNeverCalled(t *testing.T) {
	pgtest.SharedExtensionFiles(t)
	for _, sc := range squats {
		t.Run(sc.name, func(t *testing.T) {
			ctx := testCtx(t)
			dsn := pgtest.NewDatabase(t)
			admin := connect(t, dsn) // a superuser
			squatter := newRole(t, admin, "lease_squatter", true)
			installer := newRole(t, admin, "lease_installer", true)
			sq := connect(t, pgtest.WithUser(dsn, squatter))
			plantRecorder(t, sq)
			sc.plant(t, sq, squatter)

			for _, as := range []struct {
				name string
				conn *pgx.Conn
			}{{"superuser", admin}, {"installer", connect(t, pgtest.WithUser(dsn, installer))}} {
				c := lease.New(as.conn)
				calls := []struct {
					name string
					call func() error
				}{
					{"Installed", func() error {
						v, ext, err := leaseadmin.Installed(ctx, as.conn)
						if sc.extension && err == nil && (!ext || v != leaseadmin.Version) {
							return fmt.Errorf("Installed: %q %v", v, ext)
						}
						return err
					}},
					{"Describe", func() error {
						in, err := leaseadmin.Describe(ctx, as.conn)
						if err == nil && (in.Trusted || in.Owner != squatter) {
							return fmt.Errorf("Describe: %+v, want owner %s, not trusted", in, squatter)
						}
						if err == nil {
							return in.TrustError()
						}
						return err
					}},
					{"InstallExtension", func() error { return leaseadmin.InstallExtension(ctx, as.conn) }},
					{"InstallSchema", func() error { return leaseadmin.InstallSchema(ctx, as.conn) }},
					{"Cleanup", func() error { _, _, err := leaseadmin.Cleanup(ctx, c, time.Hour, 10); return err }},
					{"ForceRelease", func() error { _, _, _, err := leaseadmin.ForceRelease(ctx, c, "k"); return err }},
				}
				for _, call := range calls {
					err := call.call()
					switch {
					case call.name == "Installed" && sc.extension:
						if err != nil {
							t.Errorf("%s: Installed over the squatter's extension: %v", as.name, err)
						}
					case !errors.Is(err, leaseadmin.ErrSquatted):
						t.Errorf("%s: %s: %v, want ErrSquatted", as.name, call.name, err)
					case !strings.Contains(err.Error(), squatter):
						t.Errorf("%s: %s: %v, want the error to name the squatter %s", as.name, call.name, err, squatter)
					}
					assertNothingRan(t, admin, squatter, as.name+": "+call.name)
				}
			}
		})
	}
}

// assertNothingRan fails the test when a planted function ran or the
// squatter became superuser.
func assertNothingRan(t *testing.T, admin *pgx.Conn, squatter, after string) {
	t.Helper()
	ctx := testCtx(t)
	var ran []string
	rows, err := admin.Query(ctx, `SELECT what || ' as ' || as_role FROM squat.ran`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		ran = append(ran, s)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	var super bool
	if err := admin.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, squatter).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if len(ran) > 0 || super {
		t.Fatalf("after %s: the squatter's functions ran: %v; squatter superuser: %v", after, ran, super)
	}
}

// TestInstallOwnedByAnotherRole: an honest install that belongs to another
// role is trusted only by roles it can act as. A schema-only install by an
// installer role is not reported as installed to the superuser (who must
// not run its functions), is to the installer, and to a role the installer
// is a member of. A trusted extension created by the database owner is
// reported to the superuser (the version comes from pg_extension), but
// InstallExtension refuses to take it as the superuser's install.
func TestInstallOwnedByAnotherRole(t *testing.T) {
	pgtest.SharedExtensionFiles(t)
	t.Run("schema", func(t *testing.T) {
		ctx := testCtx(t)
		dsn := pgtest.NewDatabase(t)
		admin := connect(t, dsn)
		installer := newRole(t, admin, "lease_installer", true)
		user := newRole(t, admin, "lease_user", false)
		inst := connect(t, pgtest.WithUser(dsn, installer))
		if err := leaseadmin.InstallSchema(ctx, inst); err != nil {
			t.Fatal(err)
		}
		if v, ext, err := leaseadmin.Installed(ctx, inst); err != nil || v != leaseadmin.Version || ext {
			t.Fatalf("Installed as the installer: %q %v %v", v, ext, err)
		}
		if err := leaseadmin.InstallSchema(ctx, inst); err != nil {
			t.Fatalf("InstallSchema again as the installer: %v", err)
		}
		if _, _, err := leaseadmin.Installed(ctx, admin); !errors.Is(err, leaseadmin.ErrSquatted) {
			t.Fatalf("Installed as the superuser: %v, want ErrSquatted", err)
		}
		if err := leaseadmin.InstallSchema(ctx, admin); !errors.Is(err, leaseadmin.ErrSquatted) {
			t.Fatalf("InstallSchema as the superuser: %v, want ErrSquatted", err)
		}
		in, err := leaseadmin.Describe(ctx, admin)
		if err != nil || in.Trusted || in.Owner != installer || in.Version != leaseadmin.Version || in.Extension {
			t.Fatalf("Describe as the superuser: %+v %v", in, err)
		}
		u := connect(t, pgtest.WithUser(dsn, user))
		if in, err := leaseadmin.Describe(ctx, u); err != nil || in.Trusted {
			t.Fatalf("Describe as an unrelated role: %+v %v", in, err)
		}
		// The installer may act as user: user trusts it.
		mustExec(t, admin, fmt.Sprintf(`GRANT %q TO %q`, user, installer))
		if in, err := leaseadmin.Describe(ctx, u); err != nil || !in.Trusted {
			t.Fatalf("Describe as a role the installer is a member of: %+v %v", in, err)
		}
		// A role that may create in the schema and cannot act as the
		// installer makes it untrusted to the installer too.
		mustExec(t, inst, fmt.Sprintf(`GRANT CREATE ON SCHEMA lease TO %q`, user))
		mustExec(t, admin, fmt.Sprintf(`REVOKE %q FROM %q`, user, installer))
		if _, _, err := leaseadmin.Installed(ctx, inst); !errors.Is(err, leaseadmin.ErrSquatted) || !strings.Contains(err.Error(), user) {
			t.Fatalf("Installed with CREATE on schema lease granted to %s: %v, want ErrSquatted naming it", user, err)
		}
	})
	t.Run("extension", func(t *testing.T) {
		ctx := testCtx(t)
		dsn := pgtest.NewDatabase(t)
		admin := connect(t, dsn)
		owner := newRole(t, admin, "lease_dbowner", true)
		mustExec(t, connect(t, pgtest.WithUser(dsn, owner)), `CREATE EXTENSION pg_lease`)
		if v, ext, err := leaseadmin.Installed(ctx, admin); err != nil || v != leaseadmin.Version || !ext {
			t.Fatalf("Installed as the superuser: %q %v %v", v, ext, err)
		}
		if err := leaseadmin.InstallExtension(ctx, admin); !errors.Is(err, leaseadmin.ErrSquatted) {
			t.Fatalf("InstallExtension as the superuser over %s's extension: %v, want ErrSquatted", owner, err)
		}
		if err := leaseadmin.InstallExtension(ctx, connect(t, pgtest.WithUser(dsn, owner))); err != nil {
			t.Fatalf("InstallExtension as its owner: %v", err)
		}
	})
}

// TestDescribeIgnoresSearchPath: Describe names every catalog object and
// operator in full: an installer whose search_path puts another role's
// schema first runs nothing of it.
func TestDescribeIgnoresSearchPath(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	admin := connect(t, dsn)
	squatter := newRole(t, admin, "lease_squatter", true)
	sq := connect(t, pgtest.WithUser(dsn, squatter))
	plantRecorder(t, sq)
	mustExec(t, sq, `CREATE SCHEMA shadow`)
	mustExec(t, sq, `GRANT USAGE ON SCHEMA shadow TO PUBLIC`)
	for _, ty := range []string{"name", "oid", "text", `"char"`} {
		fn := "shadow.eq_" + strings.Trim(ty, `"`)
		mustExec(t, sq, fmt.Sprintf(`CREATE FUNCTION %s(%s, %s) RETURNS boolean LANGUAGE plpgsql AS $b$%s$b$`,
			fn, ty, ty, hostileBody(squatter, "operator = on "+ty, "RETURN false;")))
		mustExec(t, sq, fmt.Sprintf(`CREATE OPERATOR shadow.= (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s)`, ty, ty, fn))
	}
	if err := leaseadmin.InstallSchema(ctx, admin); err != nil {
		t.Fatal(err)
	}
	mustExec(t, admin, `SET search_path = shadow, pg_catalog`)
	if in, err := leaseadmin.Describe(ctx, admin); err != nil || !in.Trusted || in.Version != leaseadmin.Version {
		t.Fatalf("Describe: %+v %v", in, err)
	}
	for _, q := range []lease.Querier{admin, connect(t, dsn)} {
		if _, err := q.Exec(ctx, `SET search_path = shadow, pg_catalog`); err != nil {
			t.Fatal(err)
		}
		if v, ext, err := leaseadmin.Installed(ctx, q); err != nil || v != leaseadmin.Version || ext {
			t.Fatalf("Installed: %q %v %v", v, ext, err)
		}
		if _, _, err := leaseadmin.Cleanup(ctx, lease.New(q), time.Hour, 10); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
	}
	mustExec(t, admin, `RESET search_path`)
	assertNothingRan(t, admin, squatter, "Describe")
}

// TestClientOperatorCallsRefuseUncheckedInstall: on a database where another
// role prepared schema lease, a superuser's leaseadmin.ForceRelease and
// Cleanup refuse the install, and lease.Client's own ForceRelease and
// Cleanup (no TrustInstall) refuse to run: none runs the squatter's
// functions, which would make it superuser.
func TestClientOperatorCallsRefuseUncheckedInstall(t *testing.T) {
	pgtest.SharedExtensionFiles(t)
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	admin := connect(t, dsn) // a superuser
	squatter := newRole(t, admin, "lease_squatter", true)
	sq := connect(t, pgtest.WithUser(dsn, squatter))
	plantRecorder(t, sq)
	squats[0].plant(t, sq, squatter)
	c := lease.New(admin)

	if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "k"); !errors.Is(err, leaseadmin.ErrSquatted) {
		t.Fatalf("leaseadmin.ForceRelease: %v, want ErrSquatted", err)
	}
	if _, _, err := leaseadmin.Cleanup(ctx, c, time.Hour, 10); !errors.Is(err, leaseadmin.ErrSquatted) {
		t.Fatalf("leaseadmin.Cleanup: %v, want ErrSquatted", err)
	}
	assertNothingRan(t, admin, squatter, "leaseadmin's calls")

	// The Client's own operator calls refuse without TrustInstall, and
	// send nothing.
	if _, _, _, err := c.ForceRelease(ctx, "k"); !errors.Is(err, lease.ErrInstallNotChecked) {
		t.Fatalf("Client.ForceRelease: %v, want ErrInstallNotChecked", err)
	}
	if _, _, err := c.Cleanup(ctx, time.Hour, 10); !errors.Is(err, lease.ErrInstallNotChecked) {
		t.Fatalf("Client.Cleanup: %v, want ErrInstallNotChecked", err)
	}
	assertNothingRan(t, admin, squatter, "the Client's operator calls")
	var super bool
	if err := admin.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, squatter).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Fatal("the squatter became superuser")
	}
}

package hardening

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

// plantTypes are the argument types of the planted overloads: each planted
// name gets one function per row, so that an unpinned call with any of these
// argument types would pick the planted one over pg_catalog's.
var plantTypes = [][]string{
	{"text"}, {"text", "text"}, {"text", "text", "text"}, {"text", "text", "text", "text"},
	{"oid"}, {"integer"}, {"bigint"}, {"name"}, {"interval"}, {"timestamp with time zone"},
	{"text", "integer", "integer"}, {"regclass", "text"}, {"aclitem[]"}, {"pg_lsn"},
}

// plantOperandTypes are the operand types of the planted operators.
var plantOperandTypes = [][2]string{
	{"oid", "oid"}, {"text", "text"}, {"name", "name"}, {"name", "text"}, {`"char"`, `"char"`},
	{"bigint", "integer"}, {"integer", "integer"}, {"bigint", "bigint"}, {"boolean", "boolean"},
	{"timestamp with time zone", "timestamp with time zone"},
	{"timestamp with time zone", "interval"}, {"interval", "interval"},
}

// plant creates, as the attacker (a role whose only privilege is CREATE on
// schema public), a function for every name and an operator for every
// operator symbol, each recording in public.shadow_ran that it ran and
// trying to make the attacker superuser. It returns how many it planted.
func plant(ctx context.Context, t *testing.T, dsn, attacker string, names, ops []string) int {
	t.Helper()
	conn := pgtest.Connect(t, pgtest.WithUser(dsn, attacker))
	defer conn.Close(ctx)
	exec(ctx, t, conn, `CREATE TABLE public.shadow_ran (what text, by_role text)`)
	exec(ctx, t, conn, `GRANT INSERT ON public.shadow_ran TO PUBLIC`)
	n := 0
	body := func(what string) string {
		return fmt.Sprintf(`BEGIN
  INSERT INTO public.shadow_ran VALUES (%s, current_user);
  BEGIN EXECUTE 'ALTER ROLE %s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN EXECUTE 'GRANT pg_write_server_files, pg_read_all_data TO %s'; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN NULL;
END`, quoteLit(what), attacker, attacker)
	}
	for _, name := range names {
		for _, args := range plantTypes {
			for _, ret := range []string{"text"} {
				sig := fmt.Sprintf("public.%s(%s)", pgx.Identifier{name}.Sanitize(), strings.Join(args, ", "))
				exec(ctx, t, conn, fmt.Sprintf(`CREATE FUNCTION %s RETURNS %s LANGUAGE plpgsql AS $b$%s$b$`, sig, ret, body(sig)))
				n++
			}
		}
	}
	for i, op := range ops {
		for j, ty := range plantOperandTypes {
			fn := fmt.Sprintf("public.shadow_op_%d_%d", i, j)
			what := fmt.Sprintf("operator %s(%s, %s)", op, ty[0], ty[1])
			exec(ctx, t, conn, fmt.Sprintf(`CREATE FUNCTION %s(%s, %s) RETURNS boolean LANGUAGE plpgsql AS $b$%s$b$`,
				fn, ty[0], ty[1], body(what)))
			exec(ctx, t, conn, fmt.Sprintf(`CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s)`, op, ty[0], ty[1], fn))
			n++
		}
	}
	return n
}

func exec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// plantedNames derives what to plant from the scripts themselves: every
// function name and operator that any install or update script uses at
// install time (qualified or not), plus the names PostgreSQL resolves for
// the released scripts' unqualified calls.
func plantedNames(t *testing.T) (names, ops []string) {
	n, o := map[string]bool{}, map[string]bool{}
	scripts := installScripts(t)
	for _, f := range []string{"pg_lease--0.1.0.sql", "pg_lease--0.1.0--0.2.0.sql", "pg_lease--0.2.0--0.3.0.sql"} {
		scripts[f] = string(pgleasesql.Files()[f])
	}
	for _, s := range scripts {
		uq, q, ops := scriptCalls(s)
		for _, x := range append(uq, q...) {
			if op, ok := strings.CutPrefix(x, "operator "); ok {
				o[op] = true
			} else {
				n[x] = true
			}
		}
		for _, x := range ops {
			// Keyword forms compare through these operators.
			switch {
			case strings.HasPrefix(x, "IN ("), x == "DISTINCT FROM":
				o["="] = true
			case x == "BETWEEN":
				o[">="], o["<="] = true, true
			case x == "LIKE":
				o["~~"] = true
			case x == "ILIKE":
				o["~~*"] = true
			case x == "SIMILAR TO":
				o["~"] = true
			default:
				o[x] = true
			}
		}
	}
	// pg_lease's own names are schema-qualified (lease.f) and never planted.
	for k := range n {
		if strings.HasPrefix(k, "_") || k == "acquire" || k == "renew" || k == "release" || k == "inspect" ||
			k == "list" || k == "fence" || k == "force_release" || k == "cleanup" || k == "configure" ||
			k == "status" || k == "listen" || k == "unlisten" || k == "version" || k == "leases" ||
			k == "epoch_floor" || k == "timeline_state" || k == "listeners" || k == "settings" || k == "bit" {
			delete(n, k)
		}
	}
	return keys(n), keys(o)
}

// installPath is one way a superuser (or a database owner) installs or
// updates pg_lease in db.
type installPath struct {
	name string
	// before runs before the attacker plants (an older version installed
	// earlier, with the released scripts), as the superuser.
	before func(ctx context.Context, t *testing.T, su *pgx.Conn)
	// run installs or updates, as the superuser (su), or as the database
	// owner (dsn logs in as it).
	run func(ctx context.Context, t *testing.T, su *pgx.Conn, dsn string)
	ext bool
}

func installPaths() []installPath {
	var paths []installPath
	paths = append(paths,
		installPath{name: "CREATE EXTENSION", ext: true,
			run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
				exec(ctx, t, su, `CREATE EXTENSION pg_lease`)
			}},
		installPath{name: "CREATE EXTENSION by a database owner (trusted)", ext: true,
			run: func(ctx context.Context, t *testing.T, _ *pgx.Conn, dsn string) {
				c := pgtest.Connect(t, dsn) // as the database owner
				defer c.Close(ctx)
				exec(ctx, t, c, `CREATE EXTENSION pg_lease`)
			}},
		installPath{name: "InstallSchema", ext: false,
			run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
				if err := leaseadmin.InstallSchema(ctx, su); err != nil {
					t.Fatal(err)
				}
			}},
	)
	paths = append(paths, installPath{name: "every version named, every update path", ext: true,
		run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
			everyVersionAndUpdate(ctx, t, su)
		}})
	for _, v := range []string{"0.1.0", "0.2.0", "0.3.0", "0.4.0"} {
		paths = append(paths,
			installPath{name: "ALTER EXTENSION UPDATE from " + v, ext: true,
				before: func(ctx context.Context, t *testing.T, su *pgx.Conn) {
					exec(ctx, t, su, `CREATE EXTENSION pg_lease VERSION '`+v+`'`)
				},
				run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
					exec(ctx, t, su, `ALTER EXTENSION pg_lease UPDATE`)
				}},
			installPath{name: "InstallExtension from " + v, ext: true,
				before: func(ctx context.Context, t *testing.T, su *pgx.Conn) {
					exec(ctx, t, su, `CREATE EXTENSION pg_lease VERSION '`+v+`'`)
				},
				run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
					if err := leaseadmin.InstallExtension(ctx, su); err != nil {
						t.Fatal(err)
					}
				}},
			installPath{name: "InstallSchema from " + v, ext: false,
				before: func(ctx context.Context, t *testing.T, su *pgx.Conn) {
					installReleasedSchema(ctx, t, su, v)
				},
				run: func(ctx context.Context, t *testing.T, su *pgx.Conn, _ string) {
					if err := leaseadmin.InstallSchema(ctx, su); err != nil {
						t.Fatal(err)
					}
				}},
		)
	}
	return paths
}

// everyVersionAndUpdate runs, as the superuser su, what naming a version
// runs: CREATE EXTENSION of every version the server offers, and every
// update pg_extension_update_paths offers, each from a fresh install of its
// source (the released scripts among them). It leaves the current version
// installed. Its own queries name pg_catalog's objects in full: su's
// search_path puts public first.
func everyVersionAndUpdate(ctx context.Context, t *testing.T, su *pgx.Conn) {
	t.Helper()
	rows, err := su.Query(ctx, `SELECT version FROM pg_catalog.pg_available_extension_versions
		WHERE name OPERATOR(pg_catalog.=) 'pg_lease' ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	rows, err = su.Query(ctx, `SELECT ARRAY[source, target] FROM pg_catalog.pg_extension_update_paths('pg_lease')
		WHERE path IS NOT NULL ORDER BY source, target`)
	if err != nil {
		t.Fatal(err)
	}
	updates, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) < 5 || len(updates) < 10 {
		t.Fatalf("versions %v, updates %v: fewer than the releases make", versions, updates)
	}
	for _, v := range versions {
		exec(ctx, t, su, `CREATE EXTENSION pg_lease VERSION `+quoteLit(v))
		exec(ctx, t, su, `DROP EXTENSION pg_lease`)
	}
	for _, u := range updates {
		exec(ctx, t, su, `CREATE EXTENSION pg_lease VERSION `+quoteLit(u[0]))
		exec(ctx, t, su, `ALTER EXTENSION pg_lease UPDATE TO `+quoteLit(u[1]))
		exec(ctx, t, su, `DROP EXTENSION pg_lease`)
	}
	exec(ctx, t, su, `CREATE EXTENSION pg_lease`)
}

// installReleasedSchema installs released version v as a plain schema with
// the released scripts, as an older module's InstallSchema did.
func installReleasedSchema(ctx context.Context, t *testing.T, c *pgx.Conn, v string) {
	t.Helper()
	if v == "0.4.0" { // a full script of its own
		src := strings.ReplaceAll(string(pgleasesql.Files()["pg_lease--0.4.0.sql"]), "@extowner@", "CURRENT_USER")
		exec(ctx, t, c, src[strings.Index(src, `\quit`)+len(`\quit`):])
		return
	}
	chain := []struct{ version, file string }{
		{"0.1.0", "pg_lease--0.1.0.sql"}, {"0.2.0", "pg_lease--0.1.0--0.2.0.sql"}, {"0.3.0", "pg_lease--0.2.0--0.3.0.sql"},
	}
	for _, r := range chain {
		src := strings.ReplaceAll(string(pgleasesql.Files()[r.file]), "@extowner@", "CURRENT_USER")
		src = src[strings.Index(src, `\quit`)+len(`\quit`):]
		exec(ctx, t, c, src)
		if r.version == v {
			return
		}
	}
	t.Fatalf("no released version %s", v)
}

// TestNoEscalationThroughInstall: a role whose only privilege is CREATE on
// schema public (PostgreSQL 14's default for every role) plants a function
// for every name and an operator for every symbol the install and update
// scripts use, each trying to make it superuser. Then a superuser (or a
// database owner, for a trusted install) runs every install path and every
// update path from every released version, and creates every version by
// name and runs every update path PostgreSQL offers (the released scripts
// among them), with public first in its search_path, before pg_catalog. No planted function or operator runs, the
// role gains nothing, and the installer's search_path is as it was.
func TestNoEscalationThroughInstall(t *testing.T) {
	names, ops := plantedNames(t)
	if len(names) < 5 || len(ops) < 3 {
		t.Fatalf("too few names derived from the scripts: %v %v", names, ops)
	}
	t.Logf("planting %d names %v and %d operators %v", len(names), names, len(ops), ops)
	ctx := pgtest.Context(t, 10*time.Minute)
	admin := pgtest.Connect(t, pgtest.Shared(t).DSN())
	defer admin.Close(ctx)
	if err := pgtest.Shared(t).InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	for i, p := range installPaths() {
		t.Run(p.name, func(t *testing.T) {
			// Roles of this path's own, so that nothing one path did leaks.
			attacker := fmt.Sprintf("regress_pglease_attacker_%d", i)
			dbowner := fmt.Sprintf("regress_pglease_dbowner_%d", i)
			for _, role := range []string{attacker, dbowner} {
				_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS `+role)
				exec(ctx, t, admin, `CREATE ROLE `+role+` LOGIN`)
			}
			// (Registered before the database: cleanups run last first, so
			// the roles go after the database that holds their objects.)
			t.Cleanup(func() {
				for _, role := range []string{attacker, dbowner} {
					if _, err := admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+role); err != nil {
						t.Errorf("dropping %s: %v", role, err)
					}
				}
			})
			dsn := pgtest.NewDatabase(t)
			su := pgtest.Connect(t, dsn)
			defer su.Close(ctx)
			db := su.Config().Database
			exec(ctx, t, su, `GRANT CREATE ON SCHEMA public TO `+attacker)
			exec(ctx, t, su, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` OWNER TO `+dbowner)
			exec(ctx, t, su, `GRANT CREATE ON SCHEMA public TO `+dbowner)
			if p.before != nil {
				p.before(ctx, t, su)
			}
			planted := plant(ctx, t, dsn, attacker, names, ops)
			// The installer's own search_path puts public before pg_catalog:
			// an unpinned script would resolve even exact-signature names there.
			exec(ctx, t, su, `SET search_path = public, pg_catalog`)
			p.run(ctx, t, su, pgtest.WithUser(dsn, dbowner))
			var path string
			if err := su.QueryRow(ctx, `SELECT pg_catalog.current_setting('search_path')`).Scan(&path); err != nil || path != "public, pg_catalog" {
				t.Errorf("the installer's search_path after the install: %q %v, want it unchanged", path, err)
			}
			exec(ctx, t, su, `RESET search_path`)

			var ran []string
			rows, err := su.Query(ctx, `SELECT what || ' as ' || by_role FROM public.shadow_ran ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				ran = append(ran, s)
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			if len(ran) > 0 {
				t.Errorf("planted objects ran during the install: %v", ran)
			}
			var super, createRole, createDB bool
			var memberships int
			if err := su.QueryRow(ctx, `SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb,
				  (SELECT count(*) FROM pg_catalog.pg_auth_members m WHERE m.member = r.oid)
				  FROM pg_catalog.pg_roles r WHERE r.rolname = $1`, attacker).Scan(&super, &createRole, &createDB, &memberships); err != nil {
				t.Fatal(err)
			}
			if super || createRole || createDB || memberships > 0 {
				t.Errorf("the attacker gained privileges: superuser %v, createrole %v, createdb %v, memberships %d", super, createRole, createDB, memberships)
			}
			// The install worked: the current version, usable.
			v, ext, err := leaseadmin.Installed(ctx, su)
			if err != nil || v != pgleasesql.Version || ext != p.ext {
				t.Errorf("installed %q (extension %v) %v, want %s", v, ext, err, pgleasesql.Version)
			}
			var ok bool
			if err := su.QueryRow(ctx, `SELECT acquired FROM lease.acquire('shadow-k', 'o', '1 min')`).Scan(&ok); err != nil || !ok {
				t.Errorf("acquire after the install: %v %v", ok, err)
			}
			t.Logf("%d planted objects, none ran", planted)
		})
	}
}

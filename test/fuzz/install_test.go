package fuzz

import (
	"os"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestSchemaInstallBesideAnExtensionsSchema: the schema-only install
// (leaseadmin.InstallSchema, or the PGLEASE_FUZZ_SQL script) in a database where
// another extension owns a schema of its own. 0.3.0's update script
// registers the state tables for pg_dump only when schema lease itself is a
// member of extension pg_lease; pg_extension_config_dump outside CREATE or
// ALTER EXTENSION is an error, so a registration test that any extension's
// schema satisfies would make this install fail. (Kills the mutation pass's
// DO@0.2.0-0.3.0.logic.2: AND -> OR in that test.)
//
// The other extension is plpgsql, present in every database, made the owner
// of a schema with ALTER EXTENSION ... ADD SCHEMA (what an extension that
// creates its own schema in its script has).
func TestSchemaInstallBesideAnExtensionsSchema(t *testing.T) {
	ctx := ctxFor(t)
	dsn := pgtest.NewDatabase(t)
	conn := pgtest.Connect(t, dsn)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA fuzz_ext_owned; ALTER EXTENSION plpgsql ADD SCHEMA fuzz_ext_owned`); err != nil {
		t.Fatal(err)
	}
	var members int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
		WHERE d.refclassid = 'pg_extension'::regclass AND d.classid = 'pg_namespace'::regclass
		  AND d.deptype = 'e' AND e.extname = 'plpgsql' AND d.objid = 'fuzz_ext_owned'::regnamespace`).Scan(&members); err != nil || members != 1 {
		t.Fatalf("schema fuzz_ext_owned is not a member of extension plpgsql: count %d, %v", members, err)
	}

	if file := os.Getenv(EnvSQL); file != "" {
		if _, err := conn.Exec(ctx, "BEGIN; "+pgtest.ScriptFile(t, file, EnvSQL)+"; COMMIT"); err != nil {
			t.Fatalf("installing %s=%s as a plain schema beside an extension's schema: %v", EnvSQL, file, err)
		}
	} else if err := leaseadmin.InstallSchema(ctx, conn); err != nil {
		t.Fatalf("leaseadmin.InstallSchema beside an extension's schema: %v", err)
	}

	v, ext, err := leaseadmin.Installed(ctx, conn)
	if err != nil || ext {
		t.Fatalf("Installed: version %q, extension %v, %v; want a schema-only install", v, ext, err)
	}
	// Nothing was registered with any extension: the schema-only install's
	// tables are dumped like any table.
	var registered int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_extension e, unnest(e.extconfig) c
		WHERE c::regclass::text LIKE 'lease.%'`).Scan(&registered); err != nil || registered != 0 {
		t.Fatalf("tables of schema lease registered as some extension's configuration: %d, %v", registered, err)
	}
	// And it works.
	c := lease.New(pgtest.NewPool(t, dsn, pgtest.MaxConns(2)))
	g, ok, err := c.Acquire(ctx, "beside", "o1", 30*time.Second)
	if err != nil || !ok || g.Epoch != 1 {
		t.Fatalf("Acquire after the install: %+v, %v, %v; want epoch 1", g, ok, err)
	}
}

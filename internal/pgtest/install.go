package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Install is one way of installing pg_lease in a database.
type Install struct {
	Name string
	// Extension: CREATE EXTENSION pg_lease (the server needs the files).
	// Otherwise the schema-only install of the SQL embedded in the module.
	Extension bool
}

// Installs lists both ways. The client's tests run once per way.
var Installs = []Install{{Name: "extension", Extension: true}, {Name: "schema"}}

// NewDatabase creates a database on the shared server (or
// PGLEASE_TEST_DSN's) with pg_lease installed this way, and returns its DSN.
func (in Install) NewDatabase(t testing.TB) string {
	t.Helper()
	if in.Extension {
		return NewLeaseDatabase(t)
	}
	return installSchema(t, NewDatabase(t))
}

// NewDatabaseOn is NewDatabase on srv.
func (in Install) NewDatabaseOn(t testing.TB, srv *Server) string {
	t.Helper()
	if in.Extension {
		return NewLeaseDatabaseOn(t, srv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return installSchema(t, dsn)
}

func installSchema(t testing.TB, dsn string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := leaseadmin.InstallSchema(ctx, conn); err != nil {
		t.Fatalf("schema install: %v", err)
	}
	return dsn
}

// ForEachInstall runs f as a subtest per Install, each on a fresh database.
func ForEachInstall(t *testing.T, f func(t *testing.T, in Install, dsn string)) {
	for _, in := range Installs {
		t.Run(in.Name, func(t *testing.T) { f(t, in, in.NewDatabase(t)) })
	}
}

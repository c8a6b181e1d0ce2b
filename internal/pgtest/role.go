package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewRole creates a login role of the test's own on dsn's server, for a
// test that plays several tenants of one database: its name is prefix, an
// underscore and the database's name (roles are server-wide). It returns
// the role's name and dsn logging in as it. The role is dropped at cleanup,
// so open the role's pools and connections after NewRole: cleanups run last
// first, and they close before the drop.
func NewRole(t testing.TB, dsn, prefix string) (role, roleDSN string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role = prefix + "_" + cfg.Database
	ident := pgx.Identifier{role}.Sanitize()
	admin := Connect(t, dsn)
	if _, err := admin.Exec(Context(t, time.Minute), `CREATE ROLE `+ident+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, `DROP ROLE `+ident); err != nil {
			t.Errorf("dropping role %s: %v", role, err)
		}
	})
	return role, WithUser(dsn, role)
}

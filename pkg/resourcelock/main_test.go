package resourcelock_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newDB returns the DSN of a fresh database on the shared server with
// pg_lease installed.
func newDB(t *testing.T) string { return pgtest.NewLeaseDatabase(t) }

func newPool(t *testing.T, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

// newClient returns a lease client on a pool of its own (one per candidate,
// as separate processes would have).
func newClient(t *testing.T, dsn string) *lease.Client {
	t.Helper()
	return lease.New(newPool(t, dsn))
}

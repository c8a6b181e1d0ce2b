// Package failover tests pg_lease across a promotion: throwaway primaries
// with streaming standbys on loopback (internal/pgtest, pg_basebackup -R),
// the primary killed or left running (split brain), a standby promoted, and
// clients on the old and the new primary. See README.md for what each test
// proves and the deliberate break it fails under.
package failover

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const dbName = "failover"

// slots bounds how many clusters run at once (two cores, other packages'
// servers beside them).
var slots = pgtest.NewSlots(2)

// cluster is a throwaway primary with pg_lease in database "failover" and
// its standbys.
type cluster struct {
	primary  *pgtest.Server
	standbys []*pgtest.Server
	maxTTL   time.Duration // 0: the SQL has no lease.configure (before 0.3.0)
}

type clusterOptions struct {
	standbys int
	// maxTTL is configured with lease.configure before any grant (when the
	// installed pg_lease has it): the TTL bound and the promotion grace.
	maxTTL time.Duration
}

func newCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	slots.Take(t, "cluster")
	ctx := pgtest.Context(t, 2*time.Minute)
	p := pgtest.New(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "5s", "wal_receiver_status_interval": "1s"}})
	c := &cluster{primary: p}
	// The standbys first: where the installation has no pg_basebackup, a
	// standby is a copy of the primary's data directory made while the
	// primary is stopped, and pg_lease, installed after it, would see that
	// restart of the primary (a new era and, in mode 'any', a grace).
	for i := range o.standbys {
		c.standbys = append(c.standbys, pgtest.NewStandby(t, p, pgtest.StandbyOptions{Name: fmt.Sprintf("s%d", i+1)}))
	}
	if err := p.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := p.CreateDatabase(ctx, dbName)
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, dsn)
	if err := leaseadmin.InstallExtension(ctx, conn); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, pg_lease %s", p.Version(), installed(t, conn))
	if o.maxTTL > 0 {
		c.configure(t, conn, o.maxTTL)
	}
	// A checkpoint, replayed, then a restartpoint on each standby: the
	// standbys' buffers hold the install's pages clean, as a base backup
	// taken after the install would, so the checkpoint a promotion requests
	// has little to write and completes at once.
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	for _, st := range c.standbys {
		if err := p.WaitReplayed(ctx, st); err != nil {
			t.Fatal(err)
		}
		if _, err := pgtest.Connect(t, st.DSN()).Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// newPair is newCluster with one standby: the cluster, its primary and the
// standby.
func newPair(t *testing.T, maxTTL time.Duration) (*cluster, *pgtest.Server, *pgtest.Server) {
	t.Helper()
	c := newCluster(t, clusterOptions{standbys: 1, maxTTL: maxTTL})
	return c, c.primary, c.standbys[0]
}

// cutOff waits until st has replayed all that p has written, then stops its
// streaming: what p acknowledges from now on, st never has.
func cutOff(t *testing.T, ctx context.Context, p, st *pgtest.Server) {
	t.Helper()
	if err := p.WaitReplayed(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := st.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
}

// configure sets max_ttl with lease.configure (pg_lease 0.3.0). On a fresh
// database no grant was ever made under the default max_ttl (1 hour), so no
// belief formed under it can exist: 0.4.0 makes the lower value the grace at
// once; for 0.3.0 the test drops the grace kept for such beliefs
// (lease.settings.prev_*), which would otherwise last an hour.
func (c *cluster) configure(t *testing.T, conn *pgx.Conn, maxTTL time.Duration) {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	var has bool
	if err := conn.QueryRow(ctx, "SELECT to_regprocedure('lease.configure(interval)') IS NOT NULL OR to_regprocedure('lease.configure(interval,text)') IS NOT NULL").Scan(&has); err != nil {
		t.Fatal(err)
	}
	if !has {
		t.Logf("pg_lease %s has no lease.configure: no TTL bound, no promotion grace", installed(t, conn))
		return
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM lease.leases").Scan(&n); err != nil || n != 0 {
		t.Fatalf("configure on a database with %d lease rows (%v)", n, err)
	}
	if _, err := conn.Exec(ctx, "SELECT lease.configure(max_ttl => $1::interval)", fmt.Sprintf("%d milliseconds", maxTTL.Milliseconds())); err != nil {
		t.Fatal(err)
	}
	// Before 0.4.0 lowering max_ttl kept the old value as the grace even on a
	// database with no grant; 0.4.0 applies it at once (checked below).
	if v := installed(t, conn); v < "0.4.0" {
		if _, err := conn.Exec(ctx, "UPDATE lease.settings SET prev_max_ttl = NULL, prev_until = NULL"); err != nil {
			t.Fatal(err)
		}
	}
	var grace time.Duration
	if err := conn.QueryRow(ctx, "SELECT promotion_grace FROM lease.status()").Scan(&grace); err != nil {
		t.Fatal(err)
	}
	if grace != maxTTL {
		t.Fatalf("promotion grace %v after configuring max_ttl %v", grace, maxTTL)
	}
	c.maxTTL = maxTTL
}

func installed(t *testing.T, conn *pgx.Conn) string {
	v, _, err := leaseadmin.Installed(pgtest.Context(t, time.Minute), conn)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// dsn is the DSN of database "failover" on s.
func dsn(s *pgtest.Server) string { return s.DatabaseDSN(dbName) }

// pool opens a pool on dsn with short connect timeouts (a dead primary
// must not stall a client for long).
func pool(t *testing.T, dsn string) *pgxpool.Pool {
	return pgtest.NewPool(t, dsn, pgtest.ConnectTimeout(2*time.Second), pgtest.MaxConns(8))
}

// opCtx bounds one call: a call that hangs (a synchronous commit whose
// standby is gone, a dead server) counts as unacknowledged.
func opCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

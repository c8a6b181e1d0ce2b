package leasemetrics_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leasemetrics"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// gather collects c and returns every sample by metric name, then by key
// (the "" key for the database's own metrics; holder_info by key too).
func gather(t *testing.T, c prometheus.Collector) map[string]map[string]*dto.Metric {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]*dto.Metric{}
	for _, mf := range mfs {
		byKey := map[string]*dto.Metric{}
		for _, m := range mf.GetMetric() {
			k := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "key" {
					k = l.GetValue()
				}
			}
			byKey[k] = m
		}
		out[mf.GetName()] = byKey
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m == nil:
		return -1
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return -1
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// One scrape exports every key of the database with the values lease.health
// and lease.status give, and passes the client library's lint.
func TestCollector(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := pgtest.NewLeasePool(t)
	lc := lease.New(pool)
	if _, ok, err := lc.Acquire(ctx, "leader", "pod-a", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	g, ok, err := lc.Acquire(ctx, "shard-1", "pod-b", 30*time.Second)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := lc.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	var errs []error
	c, err := leasemetrics.New(pool, leasemetrics.Config{Period: 10 * time.Minute, OnError: func(err error) { errs = append(errs, err) },
		ShowOwners: true, ShowRoles: true, ShowDatabase: true})
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	m := gather(t, c)
	if len(errs) > 0 {
		t.Fatalf("scrape errors: %v", errs)
	}
	var db string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	up := m["pg_lease_up"][""]
	if value(up) != 1 || label(up, "database") != db {
		t.Fatalf("pg_lease_up: %v", up)
	}
	checks := []struct {
		metric, key string
		want        float64
	}{
		{"pg_lease_keys", "", 2},
		{"pg_lease_keys_omitted", "", 0},
		{"pg_lease_max_ttl_seconds", "", 3600},
		{"pg_lease_promotion_grace_remaining_seconds", "", 0},
		{"pg_lease_timeline", "", 1},
		{"pg_lease_health_period_seconds", "", 600},
		{"pg_lease_key_held", "leader", 1},
		{"pg_lease_key_held", "shard-1", 0},
		{"pg_lease_key_epoch", "leader", 1},
		{"pg_lease_key_epoch", "shard-1", 2},
		{"pg_lease_key_leaderless_seconds", "leader", 0},
		{"pg_lease_key_ttl_seconds", "leader", 60},
		{"pg_lease_key_ttl_seconds", "shard-1", 30},
		{"pg_lease_key_grants_total", "leader", 1},
		{"pg_lease_key_grants_total", "shard-1", 1},
		{"pg_lease_key_recent_transitions", "shard-1", 1},
		{"pg_lease_key_recent_leaderless_seconds", "leader", 0},
		{"pg_lease_key_term_seconds", "shard-1", 0},
	}
	for _, c := range checks {
		if got := value(m[c.metric][c.key]); got != c.want {
			t.Errorf("%s{key=%q} = %v, want %v", c.metric, c.key, got, c.want)
		}
	}
	if v := value(m["pg_lease_key_leaderless_seconds"]["shard-1"]); v <= 0 || v > 60 {
		t.Errorf("pg_lease_key_leaderless_seconds{key=shard-1} = %v, want the seconds since its release", v)
	}
	if v := value(m["pg_lease_key_term_seconds"]["leader"]); v <= 0 || v > 60 {
		t.Errorf("pg_lease_key_term_seconds{key=leader} = %v", v)
	}
	hi := m["pg_lease_key_holder_info"]
	if len(hi) != 1 || label(hi["leader"], "holder") != "pod-a" || label(hi["leader"], "role") == "" {
		t.Errorf("pg_lease_key_holder_info: %v (only held keys, with holder and role)", hi)
	}
	if m["pg_lease_key_grants_total"]["leader"].Counter == nil {
		t.Errorf("pg_lease_key_grants_total is not a counter")
	}

	// Every name the collector exports is one MetricNames lists (the names
	// the alert rules and the dashboard are checked against).
	names := strings.Join(leasemetrics.MetricNames(), " ")
	for n := range m {
		if !strings.Contains(" "+names+" ", " "+n+" ") {
			t.Errorf("exported %s is not in MetricNames: %s", n, names)
		}
	}
}

// A database the collector cannot read (here pg_lease was dropped) gives
// pg_lease_up 0 with the database it last read, no key, and the error.
func TestCollectorDown(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := pgtest.NewLeasePool(t)
	var errs []error
	c, err := leasemetrics.New(pool, leasemetrics.Config{OnError: func(err error) { errs = append(errs, err) }, ShowDatabase: true})
	if err != nil {
		t.Fatal(err)
	}
	if value(gather(t, c)["pg_lease_up"][""]) != 1 {
		t.Fatal("first scrape not up")
	}
	if _, err := pool.Exec(ctx, "DROP EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	m := gather(t, c)
	up := m["pg_lease_up"][""]
	if value(up) != 0 || label(up, "database") == "" || len(m) != 1 {
		t.Fatalf("after DROP EXTENSION: %v", m)
	}
	if len(errs) != 1 {
		t.Fatalf("OnError calls: %v", errs)
	}
}

func TestConfigValidation(t *testing.T) {
	pool := &pgxpool.Pool{}
	for _, cfg := range []leasemetrics.Config{{Period: time.Millisecond}, {Period: 367 * 24 * time.Hour}, {Timeout: -time.Second},
		{MaxKeys: -1}, {MaxKeys: leasemetrics.MaxMaxKeys + 1}, {KeyPrefixes: []string{""}}, {KeyPrefixes: []string{"a\x00"}},
		{KeyPrefixes: []string{"\xff"}}, {KeyPrefixes: make([]string, 101)}} {
		_, err := leasemetrics.New(pool, cfg)
		if !errors.Is(err, lease.ErrInvalidInput) || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("New(%+v): %v, want an error naming the field and matching lease.ErrInvalidInput", cfg, err)
		}
	}
	if _, err := leasemetrics.New(nil, leasemetrics.Config{}); err == nil {
		t.Error("New(nil): no error")
	}
	if _, err := leasemetrics.New(pool, leasemetrics.Config{}); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
}

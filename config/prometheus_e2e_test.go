package config

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/leasemetrics"
)

// promServer is a Prometheus server (the real one, Debian's prometheus
// package) on loopback, scraping one target every second and evaluating
// alerts.yaml's rules every second.
type promServer struct {
	base string
}

func startPrometheus(t *testing.T, ctx context.Context, target string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus package (apt-get install prometheus; hack/install-deps.sh does)")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(src, &pr); err != nil {
		t.Fatal(err)
	}
	rules, err := yaml.JSONToYAML(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: pg_lease
    metrics_path: %s
    static_configs: [{targets: [%q]}]
`, u.Path, u.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", lastN(string(b), 4000))
		}
	})
	p := &promServer{base: "http://" + addr}
	waitFor(t, 2*time.Minute, "prometheus ready", func() bool {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

func lastN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sample is one series of an instant query's answer.
type sample struct {
	Metric map[string]string
	Value  float64
}

// query evaluates expr at the current time.
func (p *promServer) query(t *testing.T, expr string) []sample {
	t.Helper()
	resp, err := http.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("query %q: %v %s %s", expr, err, r.Error, body)
	}
	var out []sample
	for _, s := range r.Data.Result {
		v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		out = append(out, sample{Metric: s.Metric, Value: v})
	}
	return out
}

// seen polls expr until it returns a series (Prometheus scrapes every
// second; the machine may be slow).
func (p *promServer) seen(t *testing.T, what, expr string) []sample {
	t.Helper()
	var got []sample
	waitFor(t, 90*time.Second, what+" ("+expr+")", func() bool {
		got = p.query(t, expr)
		return len(got) > 0
	})
	return got
}

// The dashboard shows a rollout and a failover, read by a real Prometheus
// from the collector: a key handed from pod to pod (one gap where nobody
// held it), then the primary killed and the standby promoted, where the
// promotion grace keeps the key free and fires PgLeasePromotionGrace, and
// the next grant comes in the new epoch era. Then every panel's query
// returns data over that history.
func TestDashboardShowsFailoverAndRollout(t *testing.T) {
	ctx := pgtest.Context(t, 8*time.Minute)
	const db = "ops"
	primary := pgtest.New(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "5s", "wal_receiver_status_interval": "1s"}})
	if err := primary.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, dsn)
	if err := leaseadmin.InstallExtension(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// max_ttl is also the promotion grace: 8 s keeps the test short and the
	// grace longer than a few scrapes. No grant is held yet, so the lower
	// value is the grace at once.
	const maxTTL = 8 * time.Second
	if _, err := conn.Exec(ctx, "SELECT lease.configure(max_ttl => make_interval(secs => $1))", maxTTL.Seconds()); err != nil {
		t.Fatal(err)
	}
	standby := pgtest.NewStandby(t, primary, pgtest.StandbyOptions{Name: "s1"})

	pc, err := pgxpool.ParseConfig(pgtest.MultiHostDSN(db, primary, standby))
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	coll, err := leasemetrics.New(pool, leasemetrics.Config{Period: 5 * time.Minute, Timeout: 5 * time.Second,
		ShowOwners: true, ShowRoles: true, ShowDatabase: true})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(coll)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	t.Cleanup(srv.Close)
	prom := startPrometheus(t, ctx, srv.URL+"/metrics")

	c := lease.New(pool)
	const key = "controller"
	grant := func(owner string) lease.Grant {
		t.Helper()
		g, err := c.AcquireWait(ctx, key, owner, maxTTL, time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", owner, err)
		}
		return g
	}
	holder := func(owner string) {
		t.Helper()
		prom.seen(t, owner+" holds the key", fmt.Sprintf(`pg_lease_key_holder_info{key=%q,holder=%q}`, key, owner))
	}

	// Rollout: pod-a hands over to pod-b at once; pod-b's replacement,
	// pod-c, comes up after a gap that Prometheus sees.
	ga := grant("pod-a")
	holder("pod-a")
	if err := c.Release(ctx, ga.Token); err != nil {
		t.Fatal(err)
	}
	gb := grant("pod-b")
	holder("pod-b")
	if err := c.Release(ctx, gb.Token); err != nil {
		t.Fatal(err)
	}
	prom.seen(t, "the key without a holder", fmt.Sprintf(`pg_lease_key_held{key=%q} == 0`, key))
	gc := grant("pod-c")
	holder("pod-c")

	// Failover: the standby has everything, the primary dies with pod-c's
	// node, the standby is promoted. pod-d's first acquire meets the
	// lapsed grant of pod-c: a grant path, which sees the new timeline and
	// starts the grace; pod-d gets the key when the grace ends.
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// pod-d tries every 200 ms, as an elector does (each try its own
	// transaction, so the grace's start commits and the collector sees it),
	// through connection errors while the standby is promoted.
	var gd lease.Grant
	waitFor(t, 3*time.Minute, "pod-d's grant after the promotion", func() bool {
		g, ok, err := c.Acquire(ctx, key, "pod-d", maxTTL)
		if err != nil {
			t.Logf("pod-d: %v", err)
		}
		gd = g
		return err == nil && ok
	})
	if gd.Epoch <= gc.Epoch || gd.Epoch < 1<<40 {
		t.Fatalf("pod-d's epoch %d after the promotion, pod-c's %d: want the next era's", gd.Epoch, gc.Epoch)
	}
	holder("pod-d")
	prom.seen(t, "the new timeline", `pg_lease_timeline == 2`)

	// What Prometheus recorded, over the whole run.
	const r = "[10m]"
	prom.seen(t, "the grace firing its alert", `max_over_time(ALERTS{alertname="PgLeasePromotionGrace",alertstate="firing"}`+r+`)`)
	if got := prom.query(t, `max_over_time(pg_lease_promotion_grace_remaining_seconds`+r+`)`); len(got) != 1 || got[0].Value <= 0 || got[0].Value > maxTTL.Seconds() {
		t.Errorf("grace remaining: %+v, want at most max_ttl %v", got, maxTTL)
	}
	if got := prom.query(t, `min_over_time(pg_lease_timeline`+r+`)`); len(got) != 1 || got[0].Value != 1 {
		t.Errorf("timeline before the promotion: %+v, want 1", got)
	}
	holders := prom.query(t, fmt.Sprintf(`count by (holder) (count_over_time(pg_lease_key_holder_info{key=%q}%s))`, key, r))
	if len(holders) != 4 {
		t.Errorf("holders seen: %+v, want pod-a to pod-d", holders)
	}
	if got := prom.query(t, fmt.Sprintf(`max_over_time(pg_lease_key_grants_total{key=%q}%s) - min_over_time(pg_lease_key_grants_total{key=%q}%s)`, key, r, key, r)); len(got) != 1 || got[0].Value != 3 {
		t.Errorf("grants counted between pod-a's and pod-d's: %+v, want 3", got)
	}
	if got := prom.query(t, fmt.Sprintf(`max_over_time(pg_lease_key_epoch{key=%q}%s)`, key, r)); len(got) != 1 || got[0].Value != float64(gd.Epoch) {
		t.Errorf("epoch: %+v, want pod-d's %d", got, gd.Epoch)
	}

	// Every panel of the dashboard has data for this run.
	src, err := os.ReadFile("prometheus/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(src, &d); err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("$database", ".*", "$key", ".*", "$__rate_interval", "10m")
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			expr := fill.Replace(tg.Expr)
			// A range of the whole run: the panel shows something for it.
			if got := prom.query(t, "max_over_time(("+expr+")[10m:1s])"); len(got) == 0 {
				t.Errorf("panel %q: %s has no data over the run", p.Title, expr)
			}
		}
	}
}

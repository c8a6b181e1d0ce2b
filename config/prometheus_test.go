package config

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/pkg/leasemetrics"
	"github.com/pglease/pg_lease/pkg/shard"
)

// promtool returns the path of Prometheus's promtool, or fails the test
// saying what to install.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (apt-get install prometheus; hack/install-deps.sh does)")
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// metricRef finds the pg_lease metric names an expression uses.
var metricRef = regexp.MustCompile(`\bpg_lease_[a-z0-9_]+\b`)

// checkMetrics fails for every pg_lease metric in expr that the collector
// does not export, and returns the names found.
func checkMetrics(t *testing.T, where, expr string) []string {
	t.Helper()
	known := append(leasemetrics.MetricNames(), shardMetricNames()...)
	names := metricRef.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: expression %q uses no pg_lease metric", where, expr)
	}
	for _, n := range names {
		if !slices.Contains(known, n) {
			t.Errorf("%s: expression %q uses %s, which pkg/leasemetrics does not export (it exports %v)", where, expr, n, known)
		}
	}
	return names
}

// fqName reads a metric's name from its Desc's description.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// shardMetricNames are the metrics of pkg/shard (every replica of a sharded
// controller exports them).
func shardMetricNames() []string {
	var names []string
	for _, c := range shard.Collectors() {
		ch := make(chan *prometheus.Desc, 8)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	return names
}

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert  string `json:"alert"`
			Record string `json:"record"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// TestAlertRules: the PrometheusRule's spec loads in promtool (check
// rules), its unit tests pass (test rules: each alert fires on the series
// it is meant for and not on the others), it has the alerts the operations
// guide names, and every metric it uses is one the collector exports.
func TestAlertRules(t *testing.T) {
	src, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Spec       json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(src, &pr); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("alerts.yaml is %s %s, want monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	spec, err := yaml.JSONToYAML(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pg_lease.rules.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile("prometheus/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runPromtool(t, dir, "check", "rules", "pg_lease.rules.yaml")
	t.Logf("promtool check rules: %s", strings.TrimSpace(out))
	out = runPromtool(t, dir, "test", "rules", "alerts_test.yaml")
	t.Logf("promtool test rules: %s", strings.TrimSpace(out))

	var g ruleGroups
	if err := yaml.Unmarshal(spec, &g); err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			alerts = append(alerts, r.Alert)
			checkMetrics(t, "alert "+r.Alert, r.Expr)
		}
	}
	for _, want := range []string{"PgLeaseNoLeader", "PgLeaseLeadershipFlapping", "PgLeaseKeyOwnedByNobody", "PgLeasePromotionGrace", "PgLeaseMetricsDown", "PgLeaseShardsUnowned", "PgLeaseMetricsKeysOmitted"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yaml has no alert %s (it has %v)", want, alerts)
		}
		// Each alert has a unit test in alerts_test.yaml.
		if !strings.Contains(string(unit), "alertname: "+want+"\n") {
			t.Errorf("alerts_test.yaml does not test %s", want)
		}
	}
}

// grafanaVar matches Grafana's template variables in an expression.
var grafanaVar = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// TestDashboard: the Grafana dashboard parses, every panel has a query,
// every query (with Grafana's variables filled in) is PromQL that promtool
// accepts, and every metric a query or a variable uses is one the
// collector exports.
func TestDashboard(t *testing.T) {
	src, err := os.ReadFile("prometheus/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"` // collapsed rows
	}
	var d struct {
		Title       string  `json:"title"`
		UID         string  `json:"uid"`
		Panels      []panel `json:"panels"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(src, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard.json: title %q, uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	fill := func(expr string) string {
		return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
			switch strings.Trim(v, "${}") {
			case "__rate_interval", "__interval", "__range":
				return "1m"
			default:
				return ".*" // $database and $key, in =~ matchers
			}
		})
	}
	var exprs []string
	ids := map[int]bool{}
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				for _, n := range checkMetrics(t, "panel "+p.Title, tg.Expr) {
					used[n] = true
				}
				exprs = append(exprs, fill(tg.Expr))
			}
		}
	}
	walk(d.Panels)
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			checkMetrics(t, "annotation "+a.Name, a.Expr)
			exprs = append(exprs, fill(a.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := json.Marshal(v.Query)
		checkMetrics(t, "variable "+v.Name, string(q))
	}

	// promtool parses each expression as a recording rule's.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(e) // a JSON string is a YAML string
		rules.WriteString("      - record: dashboard:expr" + string(rune('a'+i%26)) + strings.Repeat("x", i/26) + "\n        expr: " + string(q) + "\n")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yaml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "dashboard.rules.yaml")

	// The panels show the state of keys, their terms and promotions.
	var got []string
	for n := range used {
		got = append(got, n)
	}
	sort.Strings(got)
	for _, want := range []string{"pg_lease_key_held", "pg_lease_key_holder_info", "pg_lease_key_grants_total",
		"pg_lease_key_leaderless_seconds", "pg_lease_key_term_seconds", "pg_lease_timeline", "pg_lease_promotion_grace_remaining_seconds"} {
		if !used[want] {
			t.Errorf("no panel shows %s (panels use %v)", want, got)
		}
	}
}

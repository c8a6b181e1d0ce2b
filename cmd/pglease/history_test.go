package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// history shows a key's grants, releases, takeovers and forced releases
// with their reasons, in a table and as JSON; a never-leased key exits 5.
func TestHistoryCommand(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	acquire(t, ctx, c, "hist", "worker-a", 200*time.Millisecond)
	// b takes over once a's short grant has lapsed on the server's clock.
	var tg lease.Grant
	for {
		var ok bool
		var err error
		tg, ok, err = c.Acquire(ctx, "hist", "worker-b", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Release(ctx, tg.Token); err != nil {
		t.Fatal(err)
	}
	acquire(t, ctx, c, "hist", "worker-c", time.Minute)
	mustRun(t, ctx, e, "release", "--force", "hist")

	out := mustRun(t, ctx, e, "history", "hist")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "SEQ") {
		t.Fatalf("history: want a header and 5 events:\n%s", out)
	}
	for i, want := range []string{
		`^1 .* acquired +worker-a .* 1 +- +-$`,
		`^2 .* taken_over +worker-b .* 2 +\d.*s +the grant of worker-a \(epoch 1\) had lapsed$`,
		`^3 .* released +worker-b .* 2 `,
		`^4 .* acquired +worker-c .* 4 +\d.*s +-$`,
		`^5 .* force_released +worker-c .* 4 `,
	} {
		if !regexp.MustCompile(want).MatchString(lines[i+1]) {
			t.Errorf("history line %d: %q does not match %s", i+1, lines[i+1], want)
		}
	}

	var rows []eventRow
	out = mustRun(t, ctx, e, "history", "hist", "-o", "json", "--limit", "2")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("history -o json: %v\n%s", err, out)
	}
	if len(rows) != 2 || rows[0].Event != "acquired" || rows[0].Owner != "worker-c" || rows[0].VacantSince == nil ||
		rows[0].TTLSeconds != 60 || rows[1].Event != "force_released" || rows[1].Epoch != 4 || rows[1].Actor == "" {
		t.Fatalf("history -o json --limit 2: %+v", rows)
	}

	wantExit(t, ctx, e, exitNotFound, "history", "never-leased")
	wantExit(t, ctx, e, exitUsage, "history", "hist", "--limit", "0")
	wantExit(t, ctx, e, exitUsage, "history", "hist", "-o", "name")
}

// health shows every key's holder, term, time without a holder, and the
// terms and leaderless time of the period; named keys only when named.
func TestHealthCommand(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	acquire(t, ctx, c, "held", "leader-1", time.Minute)
	g := acquire(t, ctx, c, "free", "leader-2", time.Minute)
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, ctx, e, "health")
	if !regexp.MustCompile(`(?m)^free +<none> +2 +- +\d\S* +1 +\d`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^held +leader-1 +1 +\d\S* +- +1 +0s`).MatchString(out) {
		t.Fatalf("health:\n%s", out)
	}
	var rows []healthRow
	out = mustRun(t, ctx, e, "health", "held", "--period", "10m", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("health -o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || !rows[0].Held || rows[0].Holder != "leader-1" || rows[0].Transitions != 1 ||
		rows[0].Grants == nil || *rows[0].Grants != 1 || rows[0].PeriodSeconds != 600 || rows[0].TTLSeconds != 60 {
		t.Fatalf("health held -o json: %+v", rows)
	}
	wantExit(t, ctx, e, exitNotFound, "health", "never-leased")
	wantExit(t, ctx, e, exitUsage, "health", "--period", "0s")
}

// serve-metrics serves every key's metrics until interrupted; asked to, it
// shows owners, roles and the database; the exposition passes promtool's
// lint.
func TestServeMetrics(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "controller", "pod-a", time.Minute)
	p := start(t, ctx, dsnEnv(dsn), "serve-metrics", "--listen", "127.0.0.1:0", "--show-owners", "--show-roles", "--show-database")
	p.waitFor(t, "/metrics\n", false)
	url := regexp.MustCompile(`http://\S+/metrics`).FindString(p.out.String())
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	for _, want := range []string{
		`pg_lease_up{database="`,
		`pg_lease_key_held{database="`,
		`key="controller"} 1`,
		`pg_lease_key_holder_info{database="`,
		`holder="pod-a"`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if !regexp.MustCompile(`pg_lease_key_holder_info\{database="[^"]+",holder="pod-a",key="controller",role="[^"]+"\} 1`).Match(body) {
		t.Errorf("no holder_info naming the database, owner and role:\n%s", body)
	}
	if pt, err := exec.LookPath("promtool"); err != nil {
		t.Error("promtool not found: install Debian's prometheus package (hack/install-deps.sh does)")
	} else {
		f := filepath.Join(t.TempDir(), "metrics.txt")
		if err := os.WriteFile(f, body, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(pt, "check", "metrics")
		in, _ := os.Open(f)
		defer in.Close()
		cmd.Stdin = in
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}
	p.stopOK(t, "serve-metrics")
}

// serve-metrics' defaults: loopback, no owner, role or database name in the
// output; a bearer token, when set, guards /metrics and is never printed.
func TestServeMetricsDefaults(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "controller", "pod-a", time.Minute)

	out := mustRun(t, ctx, env{}, "serve-metrics", "--help")
	if !strings.Contains(out, `(default "127.0.0.1:9188")`) {
		t.Errorf("serve-metrics --help does not give loopback as --listen's default:\n%s", out)
	}

	const token = "tok-0123456789abcdef-secret"
	e := dsnEnv(dsn)
	e["PGLEASE_METRICS_TOKEN"] = token
	p := start(t, ctx, e, "-v", "serve-metrics", "--listen", "127.0.0.1:0")
	p.waitFor(t, "/metrics\n", false)
	url := regexp.MustCompile(`http://\S+/metrics`).FindString(p.out.String())
	get := func(auth string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Basic " + token, token} {
		if code, _ := get(auth); code != http.StatusUnauthorized {
			t.Errorf("GET /metrics with Authorization %q: %d, want 401", auth, code)
		}
	}
	code, body := get("Bearer " + token)
	if code != http.StatusOK || !strings.Contains(body, `pg_lease_key_held{database="",key="controller"} 1`) {
		t.Fatalf("GET /metrics with the token: %d\n%s", code, body)
	}
	var db, role string
	if err := pgtest.Connect(t, dsn).QueryRow(ctx, "SELECT current_database(), session_user").Scan(&db, &role); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"pod-a", "holder_info", `database="` + db, `role="` + role} {
		if strings.Contains(body, secret) {
			t.Errorf("the default metrics reveal %q:\n%s", secret, body)
		}
	}
	p.stopOK(t, "serve-metrics")
	if strings.Contains(p.out.String()+p.err.String(), token) {
		t.Errorf("the token was printed:\n%s\n%s", p.out.String(), p.err.String())
	}

	// A token that is too short is refused, without being printed.
	e["PGLEASE_METRICS_TOKEN"] = "short-secret"
	outs, errs := wantExit(t, ctx, e, exitUsage, "-v", "serve-metrics", "--listen", "127.0.0.1:0")
	if !strings.Contains(errs, "$PGLEASE_METRICS_TOKEN") || strings.Contains(outs+errs, "short-secret") {
		t.Errorf("short token: stdout %q stderr %q", outs, errs)
	}
}

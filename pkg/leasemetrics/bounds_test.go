package leasemetrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leasemetrics"
)

// scrape serves c from a pedantic registry (which refuses two series with
// the same labels) and returns the text exposition a Prometheus scrape
// gets, and its number of series.
func scrape(t *testing.T, c prometheus.Collector) (string, int) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %.2000s", rec.Code, rec.Body.String())
	}
	text := rec.Body.String()
	series := 0
	for _, line := range strings.Split(text, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			series++
		}
	}
	return text, series
}

// An unprivileged role creates 3,000 keys with 1,000-byte names. One scrape
// with the default settings stays bounded: at most 1,000 keys of at most 11
// series each, every label value at most 128 bytes, distinct keys on
// distinct series, and the keys left out counted.
func TestScrapeIsBounded(t *testing.T) {
	ctx := pgtest.Context(t, 5*time.Minute)
	dsn := pgtest.NewLeaseDatabase(t)
	role := fmt.Sprintf("pglease_mallory_%d", time.Now().UnixNano())
	if err := pgtest.Shared(t).CreateRole(ctx, role, "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	mallory := pgtest.NewPool(t, pgtest.WithUser(dsn, role))
	const n, nameLen = 3000, 1000
	if _, err := mallory.Exec(ctx, `
SELECT lease.acquire(repeat('k', $2 - 5) || lpad(i::text, 5, '0'), 'host-' || i, interval '10 min')
  FROM generate_series(1, $1) i`, n, nameLen); err != nil {
		t.Fatal(err)
	}
	c, err := leasemetrics.New(pgtest.NewPool(t, dsn), leasemetrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	text, series := scrape(t, c)
	const maxKeys, perKey, perDatabase, maxLabel = 1000, 11, 10, 128
	t.Logf("one scrape of %d keys of %d bytes: %d series, %d bytes", n, nameLen, series, len(text))
	if series > maxKeys*perKey+perDatabase {
		t.Errorf("%d series in one scrape, want at most %d", series, maxKeys*perKey+perDatabase)
	}
	// A series' line: its name, at most 4 labels of at most 128 bytes, a
	// value; plus the families' HELP and TYPE lines.
	if max := series*(60+4*(maxLabel+16)+30) + 20*400; len(text) > max {
		t.Errorf("%d bytes in one scrape, want at most %d", len(text), max)
	}
	keys := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		for _, v := range labelValues(t, line) {
			if len(v) > maxLabel || !utf8.ValidString(v) {
				t.Fatalf("label value of %d bytes (valid UTF-8: %v) in %.200s", len(v), utf8.ValidString(v), line)
			}
		}
		if strings.HasPrefix(line, "pg_lease_key_held{") {
			keys[labelValues(t, line)["key"]] = true
		}
	}
	if len(keys) != maxKeys {
		t.Errorf("%d distinct keys exported, want %d", len(keys), maxKeys)
	}
	for _, want := range []string{
		fmt.Sprintf("pg_lease_keys{database=\"\"} %d\n", n),
		fmt.Sprintf("pg_lease_keys_omitted{database=\"\"} %d\n", n-maxKeys),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the scrape lacks %q", strings.TrimSpace(want))
		}
	}
}

// labelValues parses the labels of one exposition line.
func labelValues(t *testing.T, line string) map[string]string {
	t.Helper()
	open, end := strings.IndexByte(line, '{'), strings.LastIndexByte(line, '}')
	out := map[string]string{}
	if open < 0 {
		return out
	}
	rest := line[open+1 : end]
	for rest != "" {
		eq := strings.Index(rest, `="`)
		if eq < 0 {
			t.Fatalf("malformed labels in %.200s", line)
		}
		name := rest[:eq]
		rest = rest[eq+2:]
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' {
				i++
			}
			v.WriteByte(rest[i])
		}
		out[name] = v.String()
		rest = strings.TrimPrefix(rest[i+1:], ",")
	}
	return out
}

// By default a scrape names no owner, no database role and no database:
// only keys and their state.
func TestDefaultsRevealNoOwnerRoleOrDatabase(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn := pgtest.NewLeaseDatabase(t)
	role := fmt.Sprintf("pglease_app_%d", time.Now().UnixNano())
	if err := pgtest.Shared(t).CreateRole(ctx, role, "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	app := lease.New(pgtest.NewPool(t, pgtest.WithUser(dsn, role)))
	if _, ok, err := app.Acquire(ctx, "controller", "pod-a.node-7.example", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	pool := pgtest.NewPool(t, dsn)
	var db string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	c, err := leasemetrics.New(pool, leasemetrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	text, _ := scrape(t, c)
	if !strings.Contains(text, `pg_lease_key_held{database="",key="controller"} 1`) {
		t.Errorf("the scrape lacks the held key:\n%s", text)
	}
	for _, secret := range []string{"pod-a", role, db, "holder_info"} {
		if strings.Contains(text, secret) {
			t.Errorf("the default scrape reveals %q:\n%s", secret, text)
		}
	}
}

// Label keeps short names, and shortens the others to distinct values of
// at most 128 bytes of UTF-8: long names, invalid UTF-8, and names made to
// look like another key's shortened label.
func TestLabel(t *testing.T) {
	for _, s := range []string{"", "leader", "team-a/shard-7", strings.Repeat("é", 64)} {
		if got := leasemetrics.Label(s); got != s {
			t.Errorf("Label(%q) = %q, want it unchanged", s, got)
		}
	}
	long1, long2 := strings.Repeat("k", 999)+"1", strings.Repeat("k", 999)+"2"
	l1, l2 := leasemetrics.Label(long1), leasemetrics.Label(long2)
	forged := leasemetrics.Label(l1) // a short key named like long1's label
	invalid := leasemetrics.Label("bad\xffname")
	seen := map[string]string{}
	for in, out := range map[string]string{long1: l1, long2: l2, l1: forged, "bad\xffname": invalid} {
		if len(out) > leasemetrics.MaxLabelBytes || !utf8.ValidString(out) {
			t.Errorf("Label(%.40q) = %q: %d bytes, valid UTF-8 %v", in, out, len(out), utf8.ValidString(out))
		}
		if prev, dup := seen[out]; dup {
			t.Errorf("Label(%.40q) = Label(%.40q) = %q", in, prev, out)
		}
		seen[out] = in
	}
	if !strings.HasPrefix(l1, strings.Repeat("k", 100)+"…") || !strings.HasPrefix(invalid, "bad…") {
		t.Errorf("shortened labels keep the name's start: %q, %q", l1, invalid)
	}
	// A multi-byte character is not cut in half.
	if got := leasemetrics.Label(strings.Repeat("é", 200)); !strings.HasPrefix(got, strings.Repeat("é", 50)+"…") {
		t.Errorf("Label of 200 é: %q", got)
	}
}

// KeyPrefixes selects keys, MaxKeys caps them in byte order, and the
// holder's owner string and role are each exported only when asked for.
func TestSelectionAndShown(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := pgtest.NewLeasePool(t)
	lc := lease.New(pool)
	for _, k := range []string{"team-b/z", "team-a/y", "team-a/x", "zzz"} {
		if _, ok, err := lc.Acquire(ctx, k, "pod-"+k, time.Minute); err != nil || !ok {
			t.Fatal(k, ok, err)
		}
	}
	var role string
	if err := pool.QueryRow(ctx, "SELECT session_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg        leasemetrics.Config
		want, lack []string
	}{
		{leasemetrics.Config{KeyPrefixes: []string{"team-a/"}, MaxKeys: 1},
			[]string{`pg_lease_key_held{database="",key="team-a/x"} 1`, `pg_lease_keys{database=""} 4`, `pg_lease_keys_omitted{database=""} 1`},
			[]string{`key="team-a/y"`, `key="team-b/z"`, `key="zzz"`, "holder_info"}},
		{leasemetrics.Config{KeyPrefixes: []string{"team-b/", "zz"}, ShowOwners: true},
			[]string{`pg_lease_key_holder_info{database="",holder="pod-team-b/z",key="team-b/z",role=""} 1`, `key="zzz"`, `pg_lease_keys_omitted{database=""} 0`},
			[]string{`key="team-a/`, role}},
		{leasemetrics.Config{KeyPrefixes: []string{"team-b/"}, ShowRoles: true},
			[]string{`pg_lease_key_holder_info{database="",holder="",key="team-b/z",role="` + role + `"} 1`},
			[]string{"pod-"}},
		{leasemetrics.Config{KeyPrefixes: []string{"nothing/"}},
			[]string{`pg_lease_keys{database=""} 4`, `pg_lease_keys_omitted{database=""} 0`},
			[]string{"pg_lease_key_held"}},
	} {
		c, err := leasemetrics.New(pool, tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := scrape(t, c)
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%+v: the scrape lacks %q:\n%s", tc.cfg, w, text)
			}
		}
		for _, l := range tc.lack {
			if strings.Contains(text, l) {
				t.Errorf("%+v: the scrape has %q:\n%s", tc.cfg, l, text)
			}
		}
	}
}

// Command account is the per-statement account of pg_lease's calls: for each
// version (0.3.0, 0.4.0 and this module's, each in its own database of one
// throwaway server, fsync off), which statements every kind of call runs
// inside its function and what each costs, from pg_stat_statements with
// track = all (the nested statements of the PL/pgSQL bodies) and the
// function's own execution time. The kinds, each -n calls per version in a
// window of its own (statistics reset before), the versions' calls
// interleaved one by one:
//
//	first      acquire of a never-leased key
//	grant      acquire of a free key (released before)
//	idempotent acquire by the holder of its current grant
//	renew      renewal of the caller's grant
//	release    release that frees the key
//	takeover   acquire of a lapsed key held by another owner
//	handover   release that hands the key to a registered candidate (0.4.0+)
//
// -with name=file adds a version from a full install script (installed as
// pg_lease version name), to account for a script beside the shipped ones.
//
//	go run ./bench/account -out bench/results/x -n 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

var (
	out   = flag.String("out", "bench/results/account", "results folder")
	n     = flag.Int("n", 1000, "calls per kind and version")
	vers  = flag.String("versions", "0.3.0,0.4.0,"+pgleasesql.Version, "versions to account for")
	with  = flag.String("with", "", "name=file: also a version installed from this full script")
	fsync = flag.String("fsync", "off", "the server's fsync")
)

var kinds = []string{"first", "grant", "idempotent", "renew", "release", "takeover", "handover"}

// stmt is one statement's share of a kind: per call of the kind.
type stmt struct {
	Query    string  `json:"query"`
	Toplevel bool    `json:"toplevel"`
	PerCall  float64 `json:"calls_per_op"`
	MeanUs   float64 `json:"mean_us"`
	TotalUs  float64 `json:"us_per_op"`
}

type account struct {
	Version  string  `json:"version"`
	Kind     string  `json:"kind"`
	N        int     `json:"n"`
	Skipped  string  `json:"skipped,omitempty"`
	FnUs     float64 `json:"function_us"`   // top-level call, server execution time per call
	Nested   float64 `json:"nested_per_op"` // nested statements per call
	ClientUs float64 `json:"client_p50_us"` // round trip of the call, client side, p50
	Stmts    []stmt  `json:"statements"`
	Load     float64 `json:"load1_after"`
}

type result struct {
	Env      map[string]string `json:"env"`
	Accounts []account         `json:"accounts"`
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	res := result{Env: environment()}
	settings := map[string]string{
		"shared_preload_libraries":         "pg_stat_statements",
		"pg_stat_statements.track":         "all",
		"pg_stat_statements.max":           "10000",
		"pg_stat_statements.track_utility": "off",
		"fsync":                            *fsync,
		"max_connections":                  "40",
	}
	s, err := benchutil.StartServer(ctx, settings)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	versions := strings.Split(*vers, ",")
	if *with != "" {
		name, file, ok := strings.Cut(*with, "=")
		if !ok {
			log.Fatal("-with: want name=file")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			log.Fatal(err)
		}
		dir, err := s.ExtensionDir(ctx)
		if err != nil {
			log.Fatal(err)
		}
		p := filepath.Join(dir, "pg_lease--"+name+".sql")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			log.Fatal(err)
		}
		defer os.Remove(p)
		versions = append(versions, name)
	}
	dbs := map[string]*pgx.Conn{}
	sides := map[string]*pgx.Conn{}
	for i, v := range versions {
		name := fmt.Sprintf("v%d", i)
		dsn, err := s.CreateDatabase(ctx, name)
		if err != nil {
			log.Fatal(err)
		}
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		for _, q := range []string{
			`CREATE EXTENSION pg_stat_statements`,
			fmt.Sprintf(`CREATE EXTENSION pg_lease VERSION '%s'`, v),
		} {
			if _, err := c.Exec(ctx, q); err != nil {
				log.Fatalf("%s: %s: %v", v, q, err)
			}
		}
		// The candidates of the handover kind live as long as this connection.
		side, err := pgx.Connect(ctx, dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer side.Close(ctx)
		dbs[v], sides[v] = c, side
		if err := setup(ctx, v, c, side); err != nil {
			log.Fatalf("%s: setup: %v", v, err)
		}
	}
	si, err := benchutil.ReadServerInfo(ctx, s.DatabaseDSN("v0"))
	if err != nil {
		log.Fatal(err)
	}
	res.Env["server_version"] = si.Version
	res.Env["fsync"] = si.Fsync
	admin, err := pgx.Connect(ctx, s.DatabaseDSN("v0"))
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, k := range kinds {
		as, err := runKind(ctx, admin, dbs, versions, k)
		if err != nil {
			log.Fatalf("%s: %v", k, err)
		}
		for _, a := range as {
			log.Printf("%-6s %-10s fn=%6.1fus nested=%5.1f client p50=%6.1fus", a.Version, k, a.FnUs, a.Nested, a.ClientUs)
		}
		res.Accounts = append(res.Accounts, as...)
	}
	res.Env["load_after"] = loadavg()
	if err := benchutil.WriteResults(*out, "account", res, report(res, versions)); err != nil {
		log.Fatal(err)
	}
}

// setup makes the keys each kind acts on: g-i free (acquired and released
// once), t-i lapsed (held by owner a for 1 ms), h-i held by a with a ready
// candidate b (side's connection) and a priority strategy.
func setup(ctx context.Context, v string, c, side *pgx.Conn) error {
	q := []string{
		fmt.Sprintf(`SELECT count(*) FROM generate_series(1, %d) i, lease.acquire('g-' || i, 'o', interval '1 h') a,
		   lease.release('g-' || i, 'o', a.epoch) r`, *n),
		fmt.Sprintf(`SELECT count(*) FROM generate_series(1, %d) i, lease.acquire('t-' || i, 'a', interval '1 ms') a`, *n),
	}
	handover := v >= "0.4.0"
	if handover {
		q = append(q, fmt.Sprintf(`SELECT count(*) FROM generate_series(1, %d) i, lease.set_strategy('h-' || i, 'priority') s,
		   lease.acquire('h-' || i, 'a', interval '1 h') a`, *n))
	}
	for _, s := range q {
		if _, err := c.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.60s: %w", s, err)
		}
	}
	if handover {
		if _, err := side.Exec(ctx, fmt.Sprintf(`SELECT count(*) FROM generate_series(1, %d) i,
		   lease.candidate('h-' || i, 'b', interval '1 h', NULL, 1, true) c`, *n)); err != nil {
			return fmt.Errorf("candidates: %w", err)
		}
	}
	return nil
}

// runKind runs kind k on every version: the versions' calls interleaved one
// by one in one statistics window, so that the machine's load falls on each
// alike; pg_stat_statements tells them apart by database.
func runKind(ctx context.Context, admin *pgx.Conn, dbs map[string]*pgx.Conn, versions []string, k string) ([]account, error) {
	var live []string
	accts := map[string]*account{}
	epochs := map[string][]int64{}
	for _, v := range versions {
		accts[v] = &account{Version: v, Kind: k, N: *n}
		if k == "handover" && v < "0.4.0" {
			accts[v].Skipped = "no handover before 0.4.0"
			continue
		}
		live = append(live, v)
		es, err := prepare(ctx, dbs[v], k)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v, err)
		}
		epochs[v] = es
	}
	if k == "takeover" {
		time.Sleep(5 * time.Millisecond) // the 1 ms grants of t-i have lapsed
	}
	if _, err := admin.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return nil, err
	}
	lat := map[string][]float64{}
	for i := 1; i <= *n; i++ {
		key := fmt.Sprint(i)
		for _, v := range live {
			var q string
			var args []any
			switch k {
			case "first":
				q, args = `SELECT acquired FROM lease.acquire('f-' || $1::text, 'o', interval '1 h')`, []any{key}
			case "grant", "idempotent":
				q, args = `SELECT acquired FROM lease.acquire('g-' || $1::text, 'o', interval '1 h')`, []any{key}
			case "renew":
				q, args = `SELECT status FROM lease.renew('g-' || $1::text, 'o', $2, interval '1 h')`, []any{key, epochs[v][i]}
			case "release":
				q, args = `SELECT status FROM lease.release('g-' || $1::text, 'o', $2)`, []any{key, epochs[v][i]}
			case "takeover":
				q, args = `SELECT acquired FROM lease.acquire('t-' || $1::text, 'b', interval '1 h')`, []any{key}
			case "handover":
				q, args = `SELECT status FROM lease.release('h-' || $1::text, 'a', $2)`, []any{key, epochs[v][i]}
			}
			t0 := time.Now()
			var got any
			if err := dbs[v].QueryRow(ctx, q, args...).Scan(&got); err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			lat[v] = append(lat[v], benchutil.Micros(time.Since(t0)))
			if got != true && got != "ok" {
				return nil, fmt.Errorf("%s: call %d answered %v", v, i, got)
			}
		}
	}
	var out []account
	for _, v := range versions {
		a := accts[v]
		if a.Skipped == "" {
			a.ClientUs = benchutil.Summarize(lat[v]).P50
			if err := collect(ctx, admin, dbs[v].Config().Database, a); err != nil {
				return nil, err
			}
		}
		out = append(out, *a)
	}
	return out, nil
}

// prepare plans every statement of the calls once before the window
// (generic plans) and returns the epochs of the keys kind k acts on.
func prepare(ctx context.Context, c *pgx.Conn, k string) ([]int64, error) {
	warm := map[string]string{
		"first":      `SELECT acquired FROM lease.acquire('warm-first-' || $1::text, 'o', interval '1 h')`,
		"grant":      `SELECT acquired FROM lease.acquire('warm', 'o', interval '1 h')`,
		"idempotent": `SELECT acquired FROM lease.acquire('warm', 'o', interval '1 h')`,
		"renew":      `SELECT status FROM lease.renew('warm', 'o', (SELECT epoch FROM lease.inspect('warm')), interval '1 h')`,
		"release":    `SELECT status FROM lease.release('warm', 'o', (SELECT epoch FROM lease.inspect('warm')))`,
	}
	for i := 0; i < 3; i++ {
		for _, w := range []string{"first", "grant", "idempotent", "renew", "release"} {
			var args []any
			if w == "first" {
				args = []any{fmt.Sprint(k, i)}
			}
			if _, err := c.Exec(ctx, warm[w], args...); err != nil {
				return nil, fmt.Errorf("warm-up %s: %w", w, err)
			}
		}
	}
	epochs := make([]int64, *n+1)
	if k == "renew" || k == "release" || k == "handover" {
		prefix := "g-"
		if k == "handover" {
			prefix = "h-"
		}
		rows, err := c.Query(ctx, `SELECT substr(key, 3)::int, epoch FROM lease.leases WHERE key LIKE $1 || '%'`, prefix)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var i int
			var e int64
			if err := rows.Scan(&i, &e); err != nil {
				return nil, err
			}
			if i <= *n {
				epochs[i] = e
			}
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return epochs, nil
}

// collect reads the statements of database db from pg_stat_statements into a.
func collect(ctx context.Context, admin *pgx.Conn, db string, a *account) error {
	rows, err := admin.Query(ctx, `SELECT regexp_replace(query, '\s+', ' ', 'g'), toplevel, calls, total_exec_time
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
		ORDER BY toplevel DESC, total_exec_time DESC`, db)
	if err != nil {
		return err
	}
	for rows.Next() {
		var st stmt
		var calls int64
		var total float64
		if err := rows.Scan(&st.Query, &st.Toplevel, &calls, &total); err != nil {
			return err
		}
		st.PerCall = float64(calls) / float64(*n)
		st.MeanUs = 1000 * total / float64(calls)
		st.TotalUs = 1000 * total / float64(*n)
		if st.Toplevel {
			if !strings.Contains(st.Query, "FROM lease.") {
				continue
			}
			a.FnUs += st.TotalUs
		} else {
			a.Nested += st.PerCall
		}
		a.Stmts = append(a.Stmts, st)
	}
	a.Load = benchutil.LoadAvg()
	return rows.Err()
}

func report(r result, versions []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Statement account (pg_stat_statements, track = all; %d calls per kind and version)\n\n", *n)
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Env[k])
	}
	fmt.Fprintf(&b, "\nfunction µs: the top-level call's server execution time per call (its nested statements included); "+
		"statements: nested statements per call; client p50: the call's round trip.\n\n")
	fmt.Fprintf(&b, "| kind |")
	for _, v := range versions {
		fmt.Fprintf(&b, " %s function µs | statements | client p50 µs |", v)
	}
	fmt.Fprintf(&b, "\n|---|%s\n", strings.Repeat("---|---|---|", len(versions)))
	by := map[string]account{}
	for _, a := range r.Accounts {
		by[a.Version+"/"+a.Kind] = a
	}
	for _, k := range kinds {
		fmt.Fprintf(&b, "| %s |", k)
		for _, v := range versions {
			a := by[v+"/"+k]
			if a.Skipped != "" {
				fmt.Fprintf(&b, " – | – | – |")
				continue
			}
			fmt.Fprintf(&b, " %.1f | %.1f | %.0f |", a.FnUs, a.Nested, a.ClientUs)
		}
		fmt.Fprintf(&b, "\n")
	}
	for _, k := range kinds {
		for _, v := range versions {
			a := by[v+"/"+k]
			if a.Skipped != "" {
				continue
			}
			fmt.Fprintf(&b, "\n### %s, %s (load %.2f after)\n\n| top | per call | mean µs | µs per call | statement |\n|---|---|---|---|---|\n", k, v, a.Load)
			for _, s := range a.Stmts {
				q := s.Query
				if len(q) > 140 {
					q = q[:140] + "…"
				}
				top := ""
				if s.Toplevel {
					top = "call"
				}
				fmt.Fprintf(&b, "| %s | %.2f | %.1f | %.1f | `%s` |\n", top, s.PerCall, s.MeanUs, s.TotalUs,
					strings.ReplaceAll(q, "|", "\\|"))
			}
		}
	}
	return b.String()
}

func environment() map[string]string {
	env := map[string]string{
		"date_utc":    time.Now().UTC().Format(time.RFC3339),
		"load_before": loadavg(),
		"cpu_count":   run("nproc"),
		"cpu_model":   run("sh", "-c", `awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo`),
		"uptime":      run("uptime"),
		"git":         run("git", "rev-parse", "--short", "HEAD"),
		"note":        "shared machine: other sessions ran meanwhile (see the load)",
	}
	if d := run("git", "status", "--porcelain", "--", "sql"); d != "" {
		env["git"] += " (sql/ changed)"
	}
	return env
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func run(name string, args ...string) string {
	b, err := exec.Command(name, args...).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// Command pgbench runs the seed's pgbench workloads against pg_lease and
// bare-SQL baselines of the same shape, in the same run, on throwaway servers:
//
//	W1-cycle   acquire + renew + release of a private key (3 commits)
//	W2-contend one acquire attempt on one of 4 shared keys (TTL 2 ms)
//	R          one renewal of a private held key
//
// each beside <w>_bare (hand-written UPDATEs on a plain table of the same
// shape) and <w>_select1 (SELECT 1 per statement), and R beside the floors
// of any PL/pgSQL renewal (r_plupdate: the bare UPDATE inside a function
// with renew's attributes; r_emptydef: such a function doing nothing), at
// each client count, in
// durable mode (fsync on) and statement-cost mode (fsync off). Latencies come
// from pgbench's per-transaction logs (-l). In statement-cost mode it also
// times scratch variants of lease.renew (scratch.sql) and profiles W1 with
// pg_stat_statements (track = all). Each run also reports the server's CPU
// time per transaction (every server process, from /proc). <w>_nohistory runs <w> with the leadership
// history turned off (lease.configure_history(0)): the difference is its cost.
// <w>@<version> runs <w> in a second database of the same server where
// pg_lease <version> is installed (-baseline, default 0.3.0), beside the
// same bare baselines, so that both versions' ratios come from one run.
//
//	go run ./bench/pgbench -out bench/results/x -duration 8s
package main

import (
	"bufio"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
	"github.com/pglease/pg_lease/internal/pgtest"
)

//go:embed scripts/*.sql scratch.sql
var files embed.FS

type run struct {
	Mode     string          `json:"mode"`
	Workload string          `json:"workload"`
	Clients  int             `json:"clients"`
	TPS      float64         `json:"tps"`
	Lat      benchutil.Stats `json:"latency"`
	Grants   int64           `json:"grants,omitempty"` // W2: takeovers that happened
	// CPUus: the server's CPU time (every server process) per transaction:
	// what a CPU-bound run pays per statement (a loaded machine inflates it
	// too: compare only within one run).
	CPUus float64 `json:"server_cpu_us_per_tx,omitempty"`
	Load  float64 `json:"load1_after"`
}

type modeResult struct {
	Mode    string               `json:"mode"`
	Server  benchutil.ServerInfo `json:"server"`
	Runs    []run                `json:"runs"`
	Profile []profileRow         `json:"profile,omitempty"`
	Extra   map[string]any       `json:"extra,omitempty"`
}

type profileRow struct {
	Query    string  `json:"query"`
	Toplevel bool    `json:"toplevel"`
	Calls    int64   `json:"calls"`
	MeanMs   float64 `json:"mean_ms"`
	TotalMs  float64 `json:"total_ms"`
}

var (
	out      = flag.String("out", "bench/results/pgbench", "results folder")
	duration = flag.Duration("duration", 8*time.Second, "time per workload and client count (split over -rounds)")
	rounds   = flag.Int("rounds", 2, "interleaved rounds per cell")
	clientsF = flag.String("clients", "1,4,16", "client counts")
	modesF   = flag.String("modes", "durable,stmt", "durable (fsync on) and/or stmt (fsync off)")
	variants = flag.Bool("variants", true, "time scratch variants of lease.renew and profile W1 (stmt mode)")
	reportF  = flag.String("report", "", "only rewrite pgbench.md in -out from this pgbench.json")
	baseline = flag.String("baseline", "0.3.0", "an older pg_lease version installed into a second database (bench_base); \"\": none")
	only     = flag.String("only", "", "comma-separated workloads of the main matrix to run (default: all); \"none\": only the variants")
)

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	if *reportF != "" {
		b, err := os.ReadFile(*reportF)
		if err != nil {
			log.Fatal(err)
		}
		var results []modeResult
		if err := json.Unmarshal(b, &results); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*out, "pgbench.md"), []byte(report(results)), 0o644); err != nil {
			log.Fatal(err)
		}
		return
	}
	var clients []int
	for _, f := range strings.Split(*clientsF, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			log.Fatalf("-clients: %v", err)
		}
		clients = append(clients, n)
	}
	tmp, err := os.MkdirTemp("", "pglease-pgbench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	var results []modeResult
	for _, mode := range strings.Split(*modesF, ",") {
		r, err := runMode(ctx, mode, clients, tmp)
		if err != nil {
			log.Fatalf("%s: %v", mode, err)
		}
		results = append(results, r)
		if err := benchutil.WriteJSON(*out, "pgbench.json", results); err != nil {
			log.Fatal(err)
		}
	}
	if err := benchutil.WriteResults(*out, "pgbench", results, report(results)); err != nil {
		log.Fatal(err)
	}
}

func runMode(ctx context.Context, mode string, clients []int, tmp string) (modeResult, error) {
	res := modeResult{Mode: mode, Extra: map[string]any{}}
	settings := map[string]string{
		"shared_preload_libraries": "pg_stat_statements",
		"pg_stat_statements.track": "none",
		"max_connections":          "60",
	}
	if err := benchutil.SetMode(settings, mode); err != nil {
		return res, err
	}
	s, err := benchutil.StartServer(ctx, settings)
	if err != nil {
		return res, err
	}
	defer s.Close()
	scratch, _ := files.ReadFile("scratch.sql")
	dsn, err := benchutil.CreateDB(ctx, s, "bench",
		`CREATE EXTENSION pg_stat_statements`,
		// The module's own version (0.3.0: pg_lease.notify = waiters by
		// default), with room for the 100 h TTLs of the R keys.
		`ALTER EXTENSION pg_lease UPDATE`,
		`DO $$ BEGIN IF to_regprocedure('lease.configure(interval)') IS NOT NULL OR to_regprocedure('lease.configure(interval,text)') IS NOT NULL THEN
		   PERFORM lease.configure(max_ttl => interval '1000 h'); END IF; END $$`,
		`CREATE SCHEMA bench`,
		`CREATE TABLE bench.bare (key text NOT NULL PRIMARY KEY, owner text, epoch bigint NOT NULL CHECK (epoch >= 1),
		   expires_at timestamptz NOT NULL, acquired_at timestamptz NOT NULL, lapsed_owner text, lapsed_epoch bigint)
		   WITH (fillfactor = 50)`,
		`INSERT INTO bench.bare (key, epoch, expires_at, acquired_at)
		   SELECT 'w1-' || g, 1, now(), now() FROM generate_series(0, 63) g
		   UNION ALL SELECT 'w2-' || g, 1, now(), now() FROM generate_series(1, 4) g`,
		`INSERT INTO bench.bare (key, owner, epoch, expires_at, acquired_at)
		   SELECT 'r-' || g, 'c' || g, 1, now() + interval '100 h', now() FROM generate_series(0, 63) g`,
		`SELECT count(*) FROM generate_series(0, 63) g, lease.acquire('r-' || g, 'c' || g, interval '100 h') a WHERE a.acquired AND a.epoch = 1`,
		string(scratch),
	)
	if err != nil {
		return res, err
	}
	benchDSN = dsn
	if *baseline != "" {
		if err := createBaseline(ctx, s); err != nil {
			return res, err
		}
	}
	if res.Server, err = benchutil.ReadServerInfo(ctx, dsn); err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer conn.Close(ctx)
	log.Printf("%s: %s fsync=%s", mode, res.Server.Version, res.Server.Fsync)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return res, err
	}
	postmaster = 0
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend)); err == nil {
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:])); len(f) > 1 {
			postmaster, _ = strconv.Atoi(f[1])
		}
	}
	candidates, err := createRenewCandidates(ctx, conn)
	if err != nil {
		return res, err
	}

	// Warm-up: create the W1 and W2 keys of pg_lease and fill the caches.
	warm := []string{"w1_lease", "w1_bare", "w2_lease", "w2_bare", "r_lease", "r_bare"}
	if *baseline != "" {
		warm = append(warm, "w1_lease@"+*baseline, "w2_lease@"+*baseline, "r_lease@"+*baseline)
	}
	// On a loaded machine 16 connections may take the whole warm-up to open:
	// a warm-up that ran no transaction is only logged.
	for _, w := range warm {
		if _, err := pgbench(s, tmp, w, 16, 2*time.Second, nil); err != nil {
			if !errors.Is(err, errNoTransactions) {
				return res, err
			}
			log.Printf("warm-up %s: %v", w, err)
		}
	}

	main := []string{"w1_lease", "w1_lease_nonotify", "w1_lease_nohistory", "w1_lease_always", "w1_lease_wother", "w1_lease_wsame", "w1_bare", "w1_select1",
		"w2_lease", "w2_lease_nohistory", "w2_bare", "w2_select1",
		"r_lease", "r_lease_nonotify", "r_bare", "r_plupdate", "r_emptydef", "r_select1"}
	if *baseline != "" {
		main = append(main, "w1_lease@"+*baseline, "w2_lease@"+*baseline, "r_lease@"+*baseline)
	}
	if *only == "none" {
		main = nil
	} else if *only != "" {
		main = strings.Split(*only, ",")
	}
	per := *duration / time.Duration(*rounds)
	for _, c := range clients {
		if len(main) == 0 {
			break
		}
		lat := map[string][]float64{}
		tps := map[string]float64{}
		grants := map[string]int64{}
		cpu := map[string]float64{}
		for r := 0; r < *rounds; r++ {
			for _, w := range main {
				before := w2Epochs(ctx, conn, w)
				xs, err := pgbench(s, tmp, w, c, per, nil)
				if errors.Is(err, errNoTransactions) {
					// A loaded machine: the round measured nothing (its tps
					// counts as 0; n in the report says how many were logged).
					log.Printf("%s c=%d %s round %d: %v", mode, c, w, r, errNoTransactions)
					continue
				}
				if err != nil {
					return res, err
				}
				grants[w] += w2Epochs(ctx, conn, w) - before
				lat[w] = append(lat[w], xs.lat...)
				tps[w] += xs.tps / float64(*rounds)
				cpu[w] += xs.cpuMs
			}
		}
		for _, w := range main {
			st := benchutil.Summarize(lat[w])
			var cpuUs float64
			if st.N > 0 {
				cpuUs = cpu[w] * 1000 / float64(st.N)
			}
			res.Runs = append(res.Runs, run{Mode: mode, Workload: w, Clients: c, TPS: tps[w], Lat: st, Grants: grants[w], CPUus: cpuUs, Load: benchutil.LoadAvg()})
			log.Printf("%s c=%d %-11s tps=%8.0f p50=%7.0fus p95=%7.0fus p99=%7.0fus cpu=%6.1fus/tx grants=%d", mode, c, w, tps[w], st.P50, st.P95, st.P99, cpuUs, grants[w])
		}
	}

	if *variants && (mode == "stmt" || *only != "") {
		vs := []string{"r_lease", "r_nosubtx", "r_nosp", "r_noval", "r_nonotifyfn", "r_min", "r_oneupdate",
			"r5_copy", "r5_ctid", "r5_one", "r5_onesub", "r5_noset", "r5_notl", "r5_noplan",
			"r04_copy", "r04_fullval", "r04_noval", "r04_nosubtx", "r_bare", "r_plupdate", "r_emptydef", "r_emptyfn", "r_select1"}
		if !candidates {
			vs = slices.DeleteFunc(vs, func(w string) bool { return strings.HasPrefix(w, "r04_") })
		}
		lat := map[string][]float64{}
		tps := map[string]float64{}
		for r := 0; r < *rounds; r++ {
			for _, w := range vs {
				xs, err := pgbench(s, tmp, w, 1, per, nil)
				if err != nil {
					return res, err
				}
				lat[w] = append(lat[w], xs.lat...)
				tps[w] += xs.tps / float64(*rounds)
			}
		}
		for _, w := range vs {
			st := benchutil.Summarize(lat[w])
			res.Runs = append(res.Runs, run{Mode: mode + "-variants", Workload: w, Clients: 1, TPS: tps[w], Lat: st, Load: benchutil.LoadAvg()})
			log.Printf("%s variants %-20s tps=%8.0f p50=%7.0fus p99=%7.0fus", mode, w, tps[w], st.P50, st.P99)
		}
		prof, err := profile(ctx, s, conn, tmp, per)
		if err != nil {
			return res, err
		}
		res.Profile = prof
	}
	return res, nil
}

// summary writes the two ratios the targets are set on, for this module's
// pg_lease and the -baseline version, each beside the bare baseline of the
// same run: renew ÷ bare UPDATE in stmt mode (fsync off), and the
// acquire + renew + release cycle ÷ three bare commits in durable mode
// (fsync on), by p50 latency and by throughput (bare tps ÷ lease tps).
func summary(b *strings.Builder, results []modeResult) {
	type pair struct{ mode, lease, bare, what string }
	pairs := []pair{{"stmt", "r_lease", "r_bare", "renew ÷ bare UPDATE (fsync off)"},
		{"durable", "w1_lease", "w1_bare", "acquire + renew + release ÷ three bare commits (fsync on)"}}
	fmt.Fprintf(b, "\n### The two ratios, each beside its baseline from this run\n\n")
	fmt.Fprintf(b, "| ratio | pg_lease | clients | lease p50 µs | bare p50 µs | by p50 | by tps | load after |\n|---|---|---|---|---|---|---|---|\n")
	for _, pr := range pairs {
		for _, m := range results {
			if m.Mode != pr.mode {
				continue
			}
			runs := map[string]run{}
			var cs []int
			for _, r := range m.Runs {
				if r.Mode != m.Mode {
					continue
				}
				runs[fmt.Sprintf("%s/%d", r.Workload, r.Clients)] = r
				if r.Workload == pr.bare {
					cs = append(cs, r.Clients)
				}
			}
			for _, c := range cs {
				bb := runs[fmt.Sprintf("%s/%d", pr.bare, c)]
				for _, v := range []struct{ w, name string }{{pr.lease + "@" + *baseline, *baseline}, {pr.lease, m.Server.ExtensionVersion}} {
					r, ok := runs[fmt.Sprintf("%s/%d", v.w, c)]
					if !ok {
						continue
					}
					fmt.Fprintf(b, "| %s | %s | %d | %.0f | %.0f | %.2f× | %.2f× | %.2f |\n", pr.what, v.name, c,
						r.Lat.P50, bb.Lat.P50, r.Lat.P50/bb.Lat.P50, bb.TPS/r.TPS, r.Load)
				}
			}
		}
	}
}

// createBaseline creates database bench_base with pg_lease at -baseline
// and the keys of the lease workloads, as in database bench.
func createBaseline(ctx context.Context, s *pgtest.Server) error {
	dsn, err := s.CreateDatabase(ctx, "bench_base")
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		fmt.Sprintf(`CREATE EXTENSION pg_lease VERSION '%s'`, *baseline),
		`DO $$ BEGIN IF to_regprocedure('lease.configure(interval)') IS NOT NULL OR to_regprocedure('lease.configure(interval,text)') IS NOT NULL THEN
		   PERFORM lease.configure(max_ttl => interval '1000 h'); END IF; END $$`,
		`SELECT count(*) FROM generate_series(0, 63) g, lease.acquire('r-' || g, 'c' || g, interval '100 h') a WHERE a.acquired AND a.epoch = 1`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("bench_base: %.80s: %w", q, err)
		}
	}
	var v string
	if err := conn.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`).Scan(&v); err != nil || v != *baseline {
		return fmt.Errorf("bench_base: pg_lease %q (%v), want %s", v, err, *baseline)
	}
	return nil
}

// w2Epochs is the sum of the W2 keys' epochs in the table workload w writes
// (each takeover adds one), or 0 for other workloads.
func w2Epochs(ctx context.Context, conn *pgx.Conn, w string) int64 {
	var q string
	switch {
	case strings.Contains(w, "@"):
		return 0
	case strings.HasPrefix(w, "w2_lease"): // w2_lease and its variants (w2_lease_nohistory)
		q = `SELECT coalesce(sum(epoch), 0) FROM lease.leases WHERE key LIKE 'w2-%'`
	case w == "w2_bare":
		q = `SELECT coalesce(sum(epoch), 0) FROM bench.bare WHERE key LIKE 'w2-%'`
	default:
		return 0
	}
	var n int64
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
		log.Printf("w2 epochs: %v", err)
	}
	return n
}

// errNoTransactions: a pgbench run that logged no transaction.
var errNoTransactions = errors.New("no transactions logged")

type pgbenchOut struct {
	tps   float64
	lat   []float64
	cpuMs float64 // server CPU over the run
}

var tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

func pgbench(s *pgtest.Server, tmp, workload string, clients int, d time.Duration, env []string) (pgbenchOut, error) {
	var o pgbenchOut
	db := "bench"
	if base, ok := strings.CutSuffix(workload, "@"+*baseline); ok && *baseline != "" {
		workload, db = base, "bench_base"
	}
	// <w>_nonotify: workload w with NOTIFY turned off by pg_lease's own
	// setting (SET pg_lease.notify = off), everything else unchanged.
	if base, ok := strings.CutSuffix(workload, "_nonotify"); ok {
		workload = base
		env = append(env, "PGOPTIONS=-c pg_lease.notify=off")
	}
	// <w>_always: pg_lease.notify = always (0.2.0's behaviour: every grant
	// and release notifies, registered or not).
	if base, ok := strings.CutSuffix(workload, "_always"); ok {
		workload = base
		env = append(env, "PGOPTIONS=-c pg_lease.notify=always")
	}
	// <w>_wother / <w>_wsame: the default (waiters) with one waiter present:
	// a connection that registered (lease.listen) an unrelated key, or every
	// W1 key (then every grant and release notifies), LISTENs and drains.
	for suffix, keys := range map[string][]string{"_wother": {"unrelated"}, "_wsame": w1Keys()} {
		if base, ok := strings.CutSuffix(workload, suffix); ok {
			workload = base
			stop, err := startListener(keys)
			if err != nil {
				return o, err
			}
			defer stop()
		}
	}
	// <w>_nohistory: workload w with the leadership history turned off
	// (lease.configure_history(0)) for the run, then back to the default:
	// the same run's <w> against it is the history's cost.
	if base, ok := strings.CutSuffix(workload, "_nohistory"); ok {
		workload = base
		if err := configureHistory(0); err != nil {
			return o, err
		}
		defer configureHistory(100)
	}
	script, err := files.ReadFile("scripts/" + workload + ".sql")
	if err != nil {
		return o, err
	}
	scriptPath := filepath.Join(tmp, workload+".sql")
	if err := os.WriteFile(scriptPath, script, 0o644); err != nil {
		return o, err
	}
	logDir, err := os.MkdirTemp(tmp, "log-")
	if err != nil {
		return o, err
	}
	defer os.RemoveAll(logDir)
	jobs := 1
	if clients >= 4 {
		jobs = 2
	}
	secs := int(d.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(jobs),
		"-T", strconv.Itoa(secs), "-D", "e=1", "-f", scriptPath, "-l", "--log-prefix", filepath.Join(logDir, "tx"),
		"-h", s.SocketDir(), "-p", strconv.Itoa(s.Port()), "-U", "postgres", db}
	cmd := exec.Command(pgbenchBin(s), args...)
	cmd.Env = append(os.Environ(), env...)
	cpu0 := serverCPUms()
	outb, err := cmd.CombinedOutput()
	if err != nil {
		return o, fmt.Errorf("pgbench %s: %v\n%s", workload, err, outb)
	}
	o.cpuMs = serverCPUms() - cpu0
	if m := tpsRe.FindSubmatch(outb); m != nil {
		o.tps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "tx.*"))
	for _, p := range logs {
		f, err := os.Open(p)
		if err != nil {
			return o, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 3 {
				continue
			}
			us, err := strconv.ParseFloat(fs[2], 64)
			if err == nil {
				o.lat = append(o.lat, us)
			}
		}
		f.Close()
	}
	if len(o.lat) == 0 {
		return o, fmt.Errorf("pgbench %s: %w\n%s", workload, errNoTransactions, outb)
	}
	return o, nil
}

// configureHistory sets how many events each key's history keeps
// (0: none recorded) in the bench database.
func configureHistory(rows int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, benchDSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT lease.configure_history($1)", rows)
	return err
}

// benchDSN is the bench database of the current mode (for startListener).
var benchDSN string

func w1Keys() []string {
	var ks []string
	for g := 0; g < 64; g++ {
		ks = append(ks, "w1-"+strconv.Itoa(g))
	}
	return ks
}

// startListener is one waiter process's listen connection: it registers
// keys with lease.listen (each in its own transaction), LISTENs and drains
// notifications until stop, which returns how many arrived.
func startListener(keys []string) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, benchDSN)
	if err != nil {
		cancel()
		return nil, err
	}
	for _, k := range keys {
		if _, err := conn.Exec(ctx, `SELECT lease.listen($1)`, k); err != nil {
			cancel()
			conn.Close(context.Background())
			return nil, fmt.Errorf("lease.listen(%q): %w", k, err)
		}
	}
	if _, err := conn.Exec(ctx, `LISTEN pg_lease`); err != nil {
		cancel()
		conn.Close(context.Background())
		return nil, err
	}
	done := make(chan int)
	go func() {
		n := 0
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				done <- n
				return
			}
			n++
		}
	}()
	return func() {
		cancel()
		n := <-done
		// Drop the registrations: those of a gone backend linger (notifying)
		// until the next lease.listen by anyone.
		if _, err := conn.Exec(context.Background(), `SELECT lease.unlisten('*')`); err != nil {
			log.Printf("lease.unlisten('*'): %v", err)
		}
		conn.Close(context.Background())
		log.Printf("listener on %d key(s): %d notifications", len(keys), n)
	}, nil
}

func pgbenchBin(s *pgtest.Server) string {
	if p := filepath.Join(s.BinDir(), "pgbench"); fileExists(p) {
		return p
	}
	return "pgbench"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// profile runs W1 (1 client) with pg_stat_statements tracking nested
// statements and returns the statements by total time.
func profile(ctx context.Context, s *pgtest.Server, conn *pgx.Conn, tmp string, d time.Duration) ([]profileRow, error) {
	if _, err := conn.Exec(ctx, `ALTER DATABASE bench SET pg_stat_statements.track = 'all'`); err != nil {
		return nil, err
	}
	defer conn.Exec(ctx, `ALTER DATABASE bench RESET pg_stat_statements.track`)
	if _, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return nil, err
	}
	for _, w := range []string{"w1_lease", "w1_bare"} {
		if _, err := pgbench(s, tmp, w, 1, d, nil); err != nil {
			return nil, err
		}
	}
	rows, err := conn.Query(ctx, `SELECT regexp_replace(query, '\s+', ' ', 'g'), toplevel, calls, mean_exec_time, total_exec_time
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'bench') AND calls > 100
		ORDER BY total_exec_time DESC LIMIT 30`)
	if err != nil {
		return nil, err
	}
	var out []profileRow
	for rows.Next() {
		var r profileRow
		if err := rows.Scan(&r.Query, &r.Toplevel, &r.Calls, &r.MeanMs, &r.TotalMs); err != nil {
			return nil, err
		}
		if len(r.Query) > 160 {
			r.Query = r.Query[:160] + "…"
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func report(results []modeResult) string {
	var b strings.Builder
	summary(&b, results)
	for _, m := range results {
		fmt.Fprintf(&b, "\n### pgbench, %s mode (fsync=%s, synchronous_commit=%s)\n\n", m.Mode, m.Server.Fsync, m.Server.SynchronousCommit)
		fmt.Fprintf(&b, "| workload | clients | tps | p50 µs | p95 µs | p99 µs | ratio p50 | ratio p95 | ratio p99 | W2 grants | server CPU µs/tx | ratio CPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		base := map[string]run{}
		for _, r := range m.Runs {
			if !strings.HasSuffix(r.Mode, "-variants") {
				base[fmt.Sprintf("%s/%d", r.Workload, r.Clients)] = r
			}
		}
		for _, r := range m.Runs {
			if strings.HasSuffix(r.Mode, "-variants") {
				continue
			}
			ratio, cpuRatio := "", ""
			// Every workload of a family (w1_, w2_, r_, r5_ ...) beside its bare statement.
			if wl, _, ok := strings.Cut(r.Workload, "_"); ok && r.Workload != wl+"_bare" {
				bw := wl + "_bare"
				if _, ok := base[fmt.Sprintf("%s/%d", bw, r.Clients)]; !ok && strings.HasPrefix(wl, "r") {
					bw = "r_bare" // the renewal variants (r04_, r5_)
				}
				if bb, ok := base[fmt.Sprintf("%s/%d", bw, r.Clients)]; ok {
					ratio = fmt.Sprintf("%.2f× | %.2f× | %.2f×", r.Lat.P50/bb.Lat.P50, r.Lat.P95/bb.Lat.P95, r.Lat.P99/bb.Lat.P99)
					if bb.CPUus > 0 {
						cpuRatio = fmt.Sprintf("%.2f×", r.CPUus/bb.CPUus)
					}
				}
			}
			if ratio == "" {
				ratio = " | | "
			}
			g := ""
			if strings.HasPrefix(r.Workload, "w2_") && !strings.HasSuffix(r.Workload, "select1") {
				g = fmt.Sprintf("%d (%.0f%%)", r.Grants, 100*float64(r.Grants)/float64(r.Lat.N))
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.0f | %.0f | %s | %s | %.1f | %s |\n", r.Workload, r.Clients, r.TPS, r.Lat.P50, r.Lat.P95, r.Lat.P99, ratio, g, r.CPUus, cpuRatio)
		}
		var vr []run
		for _, r := range m.Runs {
			if strings.HasSuffix(r.Mode, "-variants") {
				vr = append(vr, r)
			}
		}
		if len(vr) > 0 {
			fmt.Fprintf(&b, "\n#### lease.renew timing variants (1 client, %s mode)\n\n| variant | tps | mean µs | p50 µs | p99 µs |\n|---|---|---|---|---|\n", m.Mode)
			for _, r := range vr {
				fmt.Fprintf(&b, "| %s | %.0f | %.1f | %.0f | %.0f |\n", r.Workload, r.TPS, r.Lat.Mean, r.Lat.P50, r.Lat.P99)
			}
		}
		if len(m.Profile) > 0 {
			fmt.Fprintf(&b, "\n#### pg_stat_statements (track = all), W1 lease and bare, 1 client\n\n| toplevel | calls | mean ms | total ms | statement |\n|---|---|---|---|---|\n")
			for _, p := range m.Profile {
				fmt.Fprintf(&b, "| %v | %d | %.4f | %.0f | `%s` |\n", p.Toplevel, p.Calls, p.MeanMs, p.TotalMs, strings.ReplaceAll(p.Query, "|", "\\|"))
			}
		}
	}
	return b.String()
}

// createRenewCandidates makes scratch copies of the installed lease.renew
// (pg_get_functiondef: whatever version is installed, 0.4.0 here), each
// changed in one way, so that candidate changes of the statement cost are
// timed in the same run as the function itself:
//
//	renew04_copy     unchanged (a copy costs what the original costs)
//	renew04_fullval  the full input checks on every call, as before the
//	                 validation fast path (lease._renew_fast)
//	renew04_noval    no validation at all (the most any fast path can save)
//	renew04_nosubtx  no subtransaction around lease._renew_key (a refused
//	                 renewal would keep its row lock: the lock discipline's cost)
//
// Each replacement must match exactly once, or the benchmark stops: a
// candidate that silently equals the original would measure nothing. A
// lease.renew of another shape (0.5.0's: one UPDATE, the subtransaction only
// off the common case) gets no candidates: false.
func createRenewCandidates(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var def string
	if err := conn.QueryRow(ctx, `SELECT pg_get_functiondef('lease.renew(text,text,bigint,interval)'::regprocedure)`).Scan(&def); err != nil {
		return false, fmt.Errorf("reading lease.renew: %w", err)
	}
	fast := "IF lease._renew_fast(v_key, v_owner, v_epoch, ttl, (SELECT s.max_ttl FROM lease.settings s)) IS NOT TRUE THEN"
	if !strings.Contains(def, fast) {
		log.Printf("lease.renew is not of 0.4.0's shape: no renew04_* candidates")
		return false, nil
	}
	val := regexp.MustCompile(`(?s)  IF lease\._renew_fast\(.*?END IF;\n`)
	type edit func(string) (string, error)
	one := func(re *regexp.Regexp, repl func(string) string) edit {
		return func(b string) (string, error) {
			if n := len(re.FindAllStringIndex(b, -1)); n != 1 {
				return "", fmt.Errorf("pattern %q matches %d times in lease.renew, want 1", re.String(), n)
			}
			return re.ReplaceAllStringFunc(b, repl), nil
		}
	}
	lit := func(old, new string) edit {
		return one(regexp.MustCompile(regexp.QuoteMeta(old)), func(string) string { return new })
	}
	cands := map[string][]edit{
		"copy":    nil,
		"fullval": {lit(fast, "IF true THEN")},
		"noval":   {one(val, func(string) string { return "" })},
		"nosubtx": {lit("  BEGIN\n    SELECT r.status", "    SELECT r.status"),
			lit("  EXCEPTION WHEN SQLSTATE 'LEASE' THEN\n    RETURN;  -- status says why; the lock went with the subtransaction\n  END;\n", ""),
			// the refusal raised into the subtransaction; without it, it returns
			lit("      RAISE EXCEPTION USING ERRCODE = 'LEASE';", "      expires_at := NULL;\n      RETURN;")},
	}
	for name, edits := range cands {
		orig := strings.Replace(def, "FUNCTION lease.renew(", "FUNCTION scratch.renew04_"+name+"(", 1)
		b := orig
		for _, e := range edits {
			var err error
			if b, err = e(b); err != nil {
				return false, fmt.Errorf("candidate %s: %w", name, err)
			}
		}
		if name != "copy" && b == orig {
			return false, fmt.Errorf("candidate %s equals lease.renew", name)
		}
		if _, err := conn.Exec(ctx, b); err != nil {
			return false, fmt.Errorf("candidate %s: %w\n%s", name, err, b)
		}
		// Each renews like the original: ok for the holder, not_owner for another owner.
		for _, c := range [][2]string{{"c0", "ok"}, {"intruder", "not_owner"}} {
			var st string
			if err := conn.QueryRow(ctx, `SELECT status FROM scratch.renew04_`+name+`('r-0', $1, 1, interval '1 h')`, c[0]).Scan(&st); err != nil || st != c[1] {
				return false, fmt.Errorf("candidate %s renewing r-0 as %s: %q %v, want %s", name, c[0], st, err, c[1])
			}
		}
	}
	return true, nil
}

// postmaster is the current server's postmaster PID (0: not known; then no
// CPU is measured).
var postmaster int

// serverCPUms is the CPU time (ms) of the server so far: the postmaster's
// own and that of its reaped children (utime, stime, cutime, cstime) plus
// that of its live children. pgbench's backends exit with it, so the
// difference across a run is the server's CPU for that run's transactions.
func serverCPUms() float64 {
	if postmaster == 0 {
		return 0
	}
	fields := func(pid string) []string {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return nil
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			return nil
		}
		// after the command: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
		return strings.Fields(string(b[i+2:]))
	}
	num := func(f []string, i int) int64 { n, _ := strconv.ParseInt(f[i], 10, 64); return n }
	var ticks int64
	pm := strconv.Itoa(postmaster)
	if f := fields(pm); len(f) > 14 {
		ticks += num(f, 11) + num(f, 12) + num(f, 13) + num(f, 14)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if f := fields(e.Name()); len(f) > 12 && f[1] == pm {
			ticks += num(f, 11) + num(f, 12)
		}
	}
	return float64(ticks) * 1000 / 100 // USER_HZ is 100 on every Linux ABI Go supports
}

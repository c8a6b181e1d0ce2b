// Command physical measures the physical limits every pg_lease figure is
// bounded by, on the machine and in the run that measure pg_lease:
//
//   - the WAL flush: pg_test_fsync's time per write+flush with the server's
//     wal_sync_method (fdatasync on Linux), on the file system of the
//     throwaway servers (the -dir folder, default the temp dir);
//   - a round trip: SELECT 1 over pgx (extended protocol, loopback TCP, one
//     connection, closed loop), the least a client call can cost;
//   - a durable commit: a one-row UPDATE of a plain table in autocommit with
//     fsync on (round trip + statement + flush), the least a durable grant,
//     renewal or release can cost.
//
// Results: physical.json and physical.md in -out; docs/benchmarks.md states
// every other figure also as a ratio to these.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
)

var (
	out     = flag.String("out", "bench/results/physical", "results folder")
	samples = flag.Int("samples", 5000, "round trips and durable commits timed (each)")
	fsyncS  = flag.Int("fsync-seconds", 2, "pg_test_fsync -s (seconds per test)")
	dir     = flag.String("dir", "", "folder for pg_test_fsync's file (default: the temp dir the servers use)")
)

// Fsync is one line of pg_test_fsync's output.
type Fsync struct {
	Method   string  `json:"method"`
	OpsPerS  float64 `json:"ops_per_s"`
	UsecsOp  float64 `json:"usecs_per_op"`
	Section  string  `json:"section"`
	Selected bool    `json:"selected"` // the server's wal_sync_method
}

type result struct {
	Server        benchutil.ServerInfo `json:"server"`
	FsyncDir      string               `json:"fsync_dir"`
	Fsync         []Fsync              `json:"pg_test_fsync"`
	FlushUs       float64              `json:"flush_us"` // the selected method, one 8 kB write + flush
	RoundTrip     benchutil.Stats      `json:"select1_round_trip"`
	DurableCommit benchutil.Stats      `json:"durable_update_commit"`
	Load          float64              `json:"load1_after"`
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	var res result

	s, err := benchutil.StartServer(ctx, map[string]string{"fsync": "on"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	dsn, err := benchutil.CreateDB(ctx, s, "physical",
		`CREATE TABLE bare (k int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 50)`,
		`INSERT INTO bare VALUES (1, 0)`)
	if err != nil {
		log.Fatal(err)
	}
	if res.Server, err = benchutil.ReadServerInfo(ctx, dsn); err != nil {
		log.Fatal(err)
	}

	res.FsyncDir = *dir
	if res.FsyncDir == "" {
		res.FsyncDir = os.TempDir()
	}
	if res.Fsync, err = testFsync(ctx, filepath.Join(s.BinDir(), "pg_test_fsync"), res.FsyncDir, *fsyncS,
		res.Server.WalSyncMethod); err != nil {
		log.Fatal(err)
	}
	for _, f := range res.Fsync {
		if f.Selected {
			res.FlushUs = f.UsecsOp
		}
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	res.RoundTrip, err = timeLoop(ctx, *samples, func() error {
		var one int
		return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	})
	if err != nil {
		log.Fatal(err)
	}
	res.DurableCommit, err = timeLoop(ctx, *samples, func() error {
		_, err := conn.Exec(ctx, "UPDATE bare SET v = v + 1 WHERE k = 1")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	res.Load = benchutil.LoadAvg()

	if err := benchutil.WriteResults(*out, "physical", res, report(res)); err != nil {
		log.Fatal(err)
	}
}

// timeLoop runs f n times after n/10 warm-up calls and returns the latencies.
func timeLoop(ctx context.Context, n int, f func() error) (benchutil.Stats, error) {
	for i := 0; i < n/10; i++ {
		if err := f(); err != nil {
			return benchutil.Stats{}, err
		}
	}
	lat := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return benchutil.Stats{}, err
		}
		t0 := time.Now()
		if err := f(); err != nil {
			return benchutil.Stats{}, err
		}
		lat = append(lat, benchutil.Micros(time.Since(t0)))
	}
	return benchutil.Summarize(lat), nil
}

// A pg_test_fsync result line: "        fdatasync      1234.567 ops/sec     810 usecs/op".
var fsyncLine = regexp.MustCompile(`^\s+(\S.*?\S)\s+([0-9.]+) ops/sec\s+([0-9.]+) usecs/op`)

func testFsync(ctx context.Context, bin, dir string, secs int, method string) ([]Fsync, error) {
	f, err := os.CreateTemp(dir, "pg_test_fsync-*")
	if err != nil {
		return nil, err
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-f", name, "-s", strconv.Itoa(secs))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", bin, err, stderr.String())
	}
	var res []Fsync
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(outb))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Compare") || strings.HasPrefix(line, "Non-sync") {
			section = strings.TrimSpace(line)
			continue
		}
		m := fsyncLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ops, _ := strconv.ParseFloat(m[2], 64)
		us, _ := strconv.ParseFloat(m[3], 64)
		meth := strings.TrimSpace(strings.TrimSuffix(m[1], "*"))
		res = append(res, Fsync{Method: meth, OpsPerS: ops, UsecsOp: us, Section: section,
			// The first section is one 8 kB write per flush, as a commit record is.
			Selected: meth == method && strings.Contains(section, "one 8kB write") && !selected(res, method)})
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%s: no result lines in its output:\n%s", bin, outb)
	}
	if !selected(res, method) {
		return res, fmt.Errorf("%s: no line for the server's wal_sync_method %q in its output:\n%s", bin, method, outb)
	}
	return res, nil
}

func selected(fs []Fsync, method string) bool {
	for _, f := range fs {
		if f.Selected {
			return true
		}
	}
	return false
}

func report(r result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Physical limits (%s)\n\n", r.Server.Version)
	fmt.Fprintf(&b, "| what | p50 µs | p99 µs | mean µs | n |\n|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| WAL flush: pg_test_fsync %s, one 8 kB write (in %s) | – | – | %.1f | – |\n",
		r.Server.WalSyncMethod, r.FsyncDir, r.FlushUs)
	fmt.Fprintf(&b, "| round trip: SELECT 1 (pgx, loopback TCP) | %.1f | %.1f | %.1f | %d |\n",
		r.RoundTrip.P50, r.RoundTrip.P99, r.RoundTrip.Mean, r.RoundTrip.N)
	fmt.Fprintf(&b, "| durable commit: one-row UPDATE, autocommit, fsync on | %.1f | %.1f | %.1f | %d |\n",
		r.DurableCommit.P50, r.DurableCommit.P99, r.DurableCommit.Mean, r.DurableCommit.N)
	fmt.Fprintf(&b, "\nLoad average after: %.2f. Every pg_test_fsync line:\n\n| section | method | ops/s | µs/op |\n|---|---|---|---|\n", r.Load)
	for _, f := range r.Fsync {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f |\n", f.Section, f.Method, f.OpsPerS, f.UsecsOp)
	}
	return b.String()
}

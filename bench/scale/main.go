// Command scale measures pg_lease with many keys:
//
//   - renew throughput and latency with -keys held keys (1k, 10k, 100k),
//     renewed concurrently by -workers goroutines through one pgxpool of
//     -conns connections (lease.Client.Renew, closed loop), in durable mode
//     (fsync on) and statement-cost mode (fsync off); p99 growth from each
//     key count to the next;
//   - table and index size of lease.leases before and after -renewals
//     renewals of the largest key count (the throughput runs plus server-side
//     lease.renew calls, one transaction each, statement-cost mode), and the
//     HOT ratio (n_tup_hot_upd / n_tup_upd);
//   - the size benefit of lease.cleanup: -cleanup-keys keys acquired and
//     released (1 in 100 left held), sizes before and after clean-up and
//     VACUUM.
//
// Results: scale.json and scale.md in -out.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

var (
	out         = flag.String("out", "bench/results/scale", "results folder")
	modesF      = flag.String("modes", "durable,stmt", "durable (fsync on) and/or stmt (fsync off)")
	duration    = flag.Duration("duration", 20*time.Second, "renew time per key count and mode (split over -rounds)")
	rounds      = flag.Int("rounds", 2, "interleaved rounds")
	workers     = flag.Int("workers", 32, "renewing goroutines")
	conns       = flag.Int("conns", 8, "pool size")
	keysF       = flag.String("keys", "1000,10000,100000", "held key counts, ascending")
	renewals    = flag.Int64("renewals", 10_000_000, "renewals of the largest key count before the size is measured again (stmt mode)")
	cleanupKeys = flag.Int("cleanup-keys", 100_000, "keys acquired and released for the clean-up measurement (stmt mode)")
)

type sizes struct {
	Total int64 `json:"total_bytes"` // pg_total_relation_size(lease.leases)
	Table int64 `json:"table_bytes"` // pg_relation_size(lease.leases)
	Index int64 `json:"index_bytes"` // pg_relation_size(lease.leases_pkey)
	Rows  int64 `json:"rows"`
}

type throughput struct {
	Mode    string          `json:"mode"`
	Notify  bool            `json:"notify"`
	Keys    int             `json:"keys"`
	Renews  int64           `json:"renewals"`
	Seconds float64         `json:"seconds"`
	PerSec  float64         `json:"renewals_per_s"`
	Lat     benchutil.Stats `json:"latency"`
	Errors  int64           `json:"errors"`
}

type result struct {
	Server     map[string]benchutil.ServerInfo `json:"server"`
	Throughput []throughput                    `json:"throughput"`
	Growth     map[string]any                  `json:"size_after_renewals,omitempty"`
	Cleanup    map[string]any                  `json:"cleanup,omitempty"`
	Workers    int                             `json:"workers"`
	Conns      int                             `json:"conns"`
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	res := result{Server: map[string]benchutil.ServerInfo{}, Workers: *workers, Conns: *conns}
	for _, mode := range strings.Split(*modesF, ",") {
		if err := runMode(ctx, mode, &res); err != nil {
			log.Fatalf("%s: %v", mode, err)
		}
		if err := benchutil.WriteJSON(*out, "scale.json", res); err != nil {
			log.Fatal(err)
		}
	}
	if err := benchutil.WriteResults(*out, "scale", res, report(res)); err != nil {
		log.Fatal(err)
	}
}

func runMode(ctx context.Context, mode string, res *result) error {
	settings := map[string]string{"max_connections": "60"}
	if err := benchutil.SetMode(settings, mode); err != nil {
		return err
	}
	s, err := benchutil.StartServer(ctx, settings)
	if err != nil {
		return err
	}
	defer s.Close()
	dsns := map[int]string{}
	before := map[int]sizes{}
	counts, err := parseCounts(*keysF)
	if err != nil {
		return err
	}
	largest := counts[len(counts)-1]
	for _, n := range counts {
		dsn, err := benchutil.CreateDB(ctx, s, fmt.Sprintf("scale%d", n),
			fmt.Sprintf(`SELECT count(*) FROM generate_series(1, %d) g, lease.acquire('k-' || g, 'o-' || g, interval '%s') a WHERE a.acquired AND a.epoch = 1`, n, ttlSQL),
			renewManySQL)
		if err != nil {
			return err
		}
		dsns[n] = dsn
		if before[n], err = readSizes(ctx, dsn); err != nil {
			return err
		}
		if before[n].Rows != int64(n) {
			return fmt.Errorf("%d keys wanted, %d rows", n, before[n].Rows)
		}
	}
	if res.Server[mode], err = benchutil.ReadServerInfo(ctx, dsns[counts[0]]); err != nil {
		return err
	}

	type acc struct {
		lat    []float64
		n, err int64
		secs   float64
	}
	type cell struct {
		n      int
		notify bool
	}
	// Renewals send no notification (since the first benchmark run), so the
	// NOTIFY setting no longer matters to this loop: one cell per key count.
	var cells []cell
	for _, n := range counts {
		cells = append(cells, cell{n, true})
	}
	accs := map[cell]*acc{}
	for _, c := range cells {
		accs[c] = &acc{}
	}
	per := *duration / time.Duration(*rounds)
	for r := 0; r < *rounds; r++ {
		for _, c := range cells {
			n := c.n
			lat, cnt, errs, secs, err := renewLoop(ctx, dsns[n], n, per, c.notify)
			if err != nil {
				return err
			}
			a := accs[c]
			a.lat = append(a.lat, lat...)
			a.n += cnt
			a.err += errs
			a.secs += secs
		}
	}
	for _, c := range cells {
		a, n := accs[c], c.n
		t := throughput{Mode: mode, Notify: c.notify, Keys: n, Renews: a.n, Seconds: a.secs, PerSec: float64(a.n) / a.secs, Lat: benchutil.Summarize(a.lat), Errors: a.err}
		res.Throughput = append(res.Throughput, t)
		log.Printf("%s notify=%v %5d keys: %.0f renewals/s p50 %.0fµs p99 %.0fµs (errors %d, load %.2f)", mode, c.notify, n, t.PerSec, t.Lat.P50, t.Lat.P99, a.err, benchutil.LoadAvg())
	}
	if mode != "stmt" {
		return nil
	}

	// Size after many renewals of the largest key count.
	done := accs[cell{largest, true}].n
	rest := *renewals - done
	start := time.Now()
	if rest > 0 {
		if err := bulkRenew(ctx, dsns[largest], largest, rest); err != nil {
			return err
		}
	}
	bulkSecs := time.Since(start).Seconds()
	time.Sleep(2 * time.Second) // let the backends' statistics reach the cumulative stats
	after, err := readSizes(ctx, dsns[largest])
	if err != nil {
		return err
	}
	hot, err := readHOT(ctx, dsns[largest])
	if err != nil {
		return err
	}
	res.Growth = map[string]any{"keys": largest, "renewals": done + max(rest, 0), "bulk_server_side_renewals": max(rest, 0),
		"bulk_seconds": bulkSecs, "before": before[largest], "after": after, "stats": hot,
		"total_growth": float64(after.Total) / float64(before[largest].Total)}
	log.Printf("sizes %d keys: before %+v after %+v; %v", largest, before[largest], after, hot)

	c, err := cleanupBenefit(ctx, s)
	if err != nil {
		return err
	}
	res.Cleanup = c
	return nil
}

const renewManySQL = `CREATE PROCEDURE renew_many(lo int, hi int, n bigint) LANGUAGE plpgsql AS $$
DECLARE i bigint := 0; k int := lo; st text;
BEGIN
  WHILE i < n LOOP
    SELECT status INTO st FROM lease.renew('k-' || k, 'o-' || k, 1, interval '` + ttlSQL + `');
    IF st <> 'ok' THEN RAISE EXCEPTION 'renew k-%: %', k, st; END IF;
    COMMIT;
    i := i + 1; k := k + 1;
    IF k > hi THEN k := lo; END IF;
  END LOOP;
END $$`

func bulkRenew(ctx context.Context, dsn string, keys int, n int64) error {
	const sessions = 2
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for i := 0; i < sessions; i++ {
		lo, hi := 1+i*keys/sessions, (i+1)*keys/sessions
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, `CALL renew_many($1, $2, $3)`, lo, hi, n/sessions+1)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// renewLoop renews keys k-1..k-n (owner o-i, epoch 1) for d from -workers
// goroutines through one pool.
func renewLoop(ctx context.Context, dsn string, n int, d time.Duration, notify bool) ([]float64, int64, int64, float64, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	if !notify {
		cfg.ConnConfig.RuntimeParams["pg_lease.notify"] = "off"
	}
	cfg.MaxConns, cfg.MinConns = int32(*conns), int32(*conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	defer pool.Close()
	client := lease.New(pool)
	// Warm the pool and the plans.
	for i := 1; i <= *conns; i++ {
		if _, err := client.Renew(ctx, lease.Token{Key: fmt.Sprintf("k-%d", i), Owner: fmt.Sprintf("o-%d", i), Epoch: 1}, ttl); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	var errs atomic.Int64
	lats := make([][]float64, *workers)
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			mine := lats[w][:0]
			for k := 1 + w; time.Now().Before(stop); k += *workers {
				if k > n {
					k = 1 + w
				}
				tok := lease.Token{Key: fmt.Sprintf("k-%d", k), Owner: fmt.Sprintf("o-%d", k), Epoch: 1}
				t0 := time.Now()
				_, err := client.Renew(ctx, tok, ttl)
				el := time.Since(t0)
				if err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, benchutil.Micros(el))
			}
			lats[w] = mine
		}(w)
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	return all, int64(len(all)), errs.Load(), secs, nil
}

func readSizes(ctx context.Context, dsn string) (sizes, error) {
	var s sizes
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return s, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT pg_total_relation_size('lease.leases'), pg_relation_size('lease.leases'),
		pg_relation_size('lease.leases_pkey'), (SELECT count(*) FROM lease.leases)`).Scan(&s.Total, &s.Table, &s.Index, &s.Rows)
	return s, err
}

func readHOT(ctx context.Context, dsn string) (map[string]any, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var upd, hot, dead, live, av, v int64
	err = conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count, vacuum_count
		FROM pg_stat_user_tables WHERE relid = 'lease.leases'::regclass`).Scan(&upd, &hot, &dead, &live, &av, &v)
	if err != nil {
		return nil, err
	}
	return map[string]any{"n_tup_upd": upd, "n_tup_hot_upd": hot, "hot_ratio": float64(hot) / float64(max(upd, 1)),
		"n_dead_tup": dead, "n_live_tup": live, "autovacuum_count": av, "vacuum_count": v}, nil
}

const churnSQL = `CREATE PROCEDURE churn(n int) LANGUAGE plpgsql AS $$
DECLARE e bigint;
BEGIN
  FOR g IN 1..n LOOP
    SELECT a.epoch INTO e FROM lease.acquire('c-' || g, 'o', interval '` + ttlSQL + `') a;
    IF g % 100 <> 0 THEN
      PERFORM lease.release('c-' || g, 'o', e);
    END IF;
    IF g % 100 = 0 THEN COMMIT; END IF;
  END LOOP;
  COMMIT;
END $$`

func cleanupBenefit(ctx context.Context, s *pgtest.Server) (map[string]any, error) {
	dsn, err := benchutil.CreateDB(ctx, s, "cleanup", churnSQL)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET pg_lease.notify = off`); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := conn.Exec(ctx, `CALL churn($1)`, *cleanupKeys); err != nil {
		return nil, err
	}
	churnSecs := time.Since(t0).Seconds()
	if _, err := conn.Exec(ctx, `VACUUM lease.leases`); err != nil {
		return nil, err
	}
	before, err := readSizes(ctx, dsn)
	if err != nil {
		return nil, err
	}
	var removed, calls int64
	var floor int64
	t0 = time.Now()
	for i := 0; i < 1000; i++ {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT removed, epoch_floor FROM lease.cleanup(interval '0 s', 10000)`).Scan(&n, &floor); err != nil {
			return nil, err
		}
		calls++
		removed += n
		if n == 0 {
			break
		}
	}
	cleanupSecs := time.Since(t0).Seconds()
	afterCleanup, err := readSizes(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `VACUUM lease.leases`); err != nil {
		return nil, err
	}
	afterVacuum, err := readSizes(ctx, dsn)
	if err != nil {
		return nil, err
	}
	// Space reuse: as many new keys again as were removed, after VACUUM.
	if _, err := conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, $1::int) g, lease.acquire('n-' || g, 'o', interval '`+ttlSQL+`') a`, removed); err != nil {
		return nil, err
	}
	afterRefill, err := readSizes(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `VACUUM FULL lease.leases`); err != nil {
		return nil, err
	}
	afterFull, err := readSizes(ctx, dsn)
	if err != nil {
		return nil, err
	}
	r := map[string]any{"keys": *cleanupKeys, "held": *cleanupKeys / 100, "churn_seconds": churnSecs,
		"removed": removed, "cleanup_calls": calls, "cleanup_seconds": cleanupSecs, "epoch_floor": floor,
		"before": before, "after_cleanup": afterCleanup, "after_vacuum": afterVacuum,
		"after_refill_same_number_of_new_keys": afterRefill, "after_refill_vacuum_full": afterFull}
	log.Printf("cleanup: %+v", r)
	return r, nil
}

func report(res result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Renew throughput through a pool (%d goroutines, %d connections)\n\n", res.Workers, res.Conns)
	fmt.Fprintf(&b, "| mode | NOTIFY | keys | renewals | renewals/s | p50 µs | p95 µs | p99 µs | errors |\n|---|---|---|---|---|---|---|---|---|\n")
	p99 := map[string]float64{}
	for _, t := range res.Throughput {
		nt := "on"
		if !t.Notify {
			nt = "off"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %d |\n", t.Mode, nt, t.Keys, t.Renews, t.PerSec, t.Lat.P50, t.Lat.P95, t.Lat.P99, t.Errors)
		p99[fmt.Sprintf("%s/%s/%d", t.Mode, nt, t.Keys)] = t.Lat.P99
	}
	fmt.Fprintf(&b, "\n")
	for _, m := range []string{"durable", "stmt"} {
		var prev *throughput
		for i := range res.Throughput {
			t := &res.Throughput[i]
			if t.Mode != m {
				continue
			}
			if prev != nil {
				fmt.Fprintf(&b, "p99 growth %d → %d keys, %s: %.2f×\n", prev.Keys, t.Keys, m, t.Lat.P99/prev.Lat.P99)
			}
			prev = t
		}
	}
	if g := res.Growth; g != nil {
		bf, af := g["before"].(sizes), g["after"].(sizes)
		fmt.Fprintf(&b, "\n### Size of lease.leases, %v keys, before and after %v renewals\n\n", g["keys"], g["renewals"])
		fmt.Fprintf(&b, "| | total | table | index (leases_pkey) |\n|---|---|---|---|\n")
		fmt.Fprintf(&b, "| before | %s | %s | %s |\n| after | %s | %s | %s |\n| ratio | %.2f× | %.2f× | %.2f× |\n",
			kb(bf.Total), kb(bf.Table), kb(bf.Index), kb(af.Total), kb(af.Table), kb(af.Index),
			float64(af.Total)/float64(bf.Total), float64(af.Table)/float64(bf.Table), float64(af.Index)/float64(bf.Index))
		st := g["stats"].(map[string]any)
		fmt.Fprintf(&b, "\nHOT: n_tup_hot_upd %v / n_tup_upd %v = %.4f; n_dead_tup %v; autovacuum runs %v.\n", st["n_tup_hot_upd"], st["n_tup_upd"], st["hot_ratio"], st["n_dead_tup"], st["autovacuum_count"])
	}
	if c := res.Cleanup; c != nil {
		fmt.Fprintf(&b, "\n### lease.cleanup: %v keys acquired and released (%v left held), clean-up of every free key\n\n", c["keys"], c["held"])
		fmt.Fprintf(&b, "| state | rows | total | table | index |\n|---|---|---|---|---|\n")
		for _, k := range []string{"before", "after_cleanup", "after_vacuum", "after_refill_same_number_of_new_keys", "after_refill_vacuum_full"} {
			s := c[k].(sizes)
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", k, s.Rows, kb(s.Total), kb(s.Table), kb(s.Index))
		}
		fmt.Fprintf(&b, "\nRemoved %v rows in %v calls of lease.cleanup('0 s', 10000), %.2f s; epoch floor afterwards %v.\n", c["removed"], c["cleanup_calls"], c["cleanup_seconds"], c["epoch_floor"])
	}
	return b.String()
}

// ttl is every grant's and renewal's TTL: long enough that no key lapses
// during a run, and within pg_lease 0.3.0's default maximum TTL (1 hour).
const (
	ttl    = 50 * time.Minute
	ttlSQL = "50 min"
)

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || (len(out) > 0 && n <= out[len(out)-1]) {
			return nil, fmt.Errorf("-keys %q: want ascending positive counts", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func kb(n int64) string { return fmt.Sprintf("%d kB", n/1024) }

// Command waiters measures many waiters on one key: W
// waiters (goroutines, each a follower in listen.AwaitAcquire on the key,
// which acquires when the key may be free; the waiters of one listen.Waiter
// send one acquire per wake-up between them) spread over N listen.Waiters
// (N listen connections: N simulated processes, each registering the key
// once with lease.listen), reading and acquiring through one pgxpool of P
// connections. With -each, every shape also runs the way before
// AwaitAcquire: each waiter in listen.Await, then its own wait-0 acquire
// when it sees the key free. The key is always held: each round the
// driver releases the current holder's grant and the herd competes; the one
// winner holds until the next round.
//
// Per run it prints and records (waiters.json, waiters.md in -out):
//
//   - release-to-grant latency (driver's release call start to the winner's
//     acquire returning), p50/p99/max;
//   - winners per release (the bench's own check: exactly one, or it fails);
//   - the server's CPU (utime+stime of every server process, from
//     /proc/<pid>/stat, before and after the rounds) and the number of
//     statements (pg_stat_statements calls, top level) per release, i.e.
//     the herd's cost, beside the baseline's and the target's;
//
// for the herd (-waiters over -conns) and, in the same run, a baseline of
// -baseline waiters on one connection. Nothing asserts a time. The target
// of statements per release is about one acquire per listen connection
// (statementTarget).
//
// Why goroutines over ~50 connections: one listen connection per simulated
// process is what a real deployment has, but 1,000 backends on a 2-core
// host would measure process scheduling, not pg_lease; the fan-out of a
// notification is per listening backend (N), the reads are per waiter (W).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

var (
	out       = flag.String("out", "bench/results/waiters", "results folder")
	waitersF  = flag.Int("waiters", 1000, "waiters on the key (goroutines)")
	connsF    = flag.Int("conns", 50, "listen.Waiters (listen connections) the waiters are spread over")
	poolF     = flag.Int("pool", 50, "connections of the pool the waiters read and acquire through")
	releases  = flag.Int("releases", 30, "releases (rounds) per run")
	baseline  = flag.Int("baseline", 1, "waiters of the baseline run (on one listen connection); 0: none")
	alsoF     = flag.String("also", "50x50", "more runs, WAITERSxCONNS comma-separated (50x50: one waiter per simulated process); empty: none")
	settle    = flag.Duration("settle", 300*time.Millisecond, "pause after each grant, so each round's herd has finished before the next release")
	fsync     = flag.String("fsync", "on", "server fsync (on: durable commits)")
	handoverF = flag.Bool("handover", false, "run every shape twice: the waiters race (as without candidates), then each waiter is a registered candidate and the key's strategy is priority, so each release grants the key to one of them")
	observeF  = flag.Bool("observe", true, "set the pool up as the README says, with lease.ObserveCommits (a change is one statement); false: a plain pool, on which each change is three (BEGIN, the call, COMMIT)")
	eachF     = flag.Bool("each", false, "also run every shape with each waiter sending its own acquire (listen.Await, then Acquire), as before listen.AwaitAcquire")
)

// statementTarget is the most statements per release a herd of waiters
// over conns listen connections should cost without a handover: one
// acquire per connection, the release, and ten for the winner's reads and
// the registrations.
func statementTarget(conns int) float64 { return float64(conns + 10) }

const key = "hot"

type result struct {
	Waiters      int                  `json:"waiters"`
	Conns        int                  `json:"listen_conns"`
	Pool         int                  `json:"pool_conns"`
	Releases     int                  `json:"releases"`
	ReleaseGrant benchutil.Stats      `json:"release_to_grant"`
	MinWinners   int                  `json:"min_winners_per_release"`
	MaxWinners   int                  `json:"max_winners_per_release"`
	CPUms        float64              `json:"server_cpu_ms_per_release"`
	Statements   float64              `json:"statements_per_release"`
	Load         float64              `json:"load"`
	Handover     bool                 `json:"handover"`
	Each         bool                 `json:"each_acquires"` // every waiter its own acquire
	Target       float64              `json:"statements_per_release_target,omitempty"`
	Observe      bool                 `json:"observe_commits"` // the pool: lease.ObserveCommits
	Server       benchutil.ServerInfo `json:"server"`
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	s, err := benchutil.StartServer(ctx, map[string]string{
		"shared_preload_libraries": "pg_stat_statements",
		"pg_stat_statements.track": "top",
		"max_connections":          strconv.Itoa(*connsF + *poolF + 30),
		"fsync":                    *fsync,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	dsn, err := benchutil.CreateDB(ctx, s, "bench", `CREATE EXTENSION pg_stat_statements`, `ALTER EXTENSION pg_lease UPDATE`)
	if err != nil {
		log.Fatal(err)
	}
	info, err := benchutil.ReadServerInfo(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%s, pg_lease %s, fsync=%s", info.Version, info.ExtensionVersion, info.Fsync)
	var results []result
	shapes := [][2]int{}
	if *baseline > 0 {
		shapes = append(shapes, [2]int{*baseline, 1})
	}
	for _, a := range strings.Split(*alsoF, ",") {
		if a == "" {
			continue
		}
		var wn, cn int
		if _, err := fmt.Sscanf(a, "%dx%d", &wn, &cn); err != nil || wn < 1 || cn < 1 {
			log.Fatalf("-also %q: want WAITERSxCONNS", a)
		}
		shapes = append(shapes, [2]int{wn, cn})
	}
	shapes = append(shapes, [2]int{*waitersF, *connsF})
	failed := false
	modes := []bool{false}
	if *handoverF {
		modes = append(modes, true)
	}
	eachModes := []bool{false}
	if *eachF {
		eachModes = append(eachModes, true)
	}
	for _, sh := range shapes {
		for _, each := range eachModes {
			for _, ho := range modes {
				r, err := run(ctx, dsn, sh[0], sh[1], ho, each)
				r.Server = info
				if err != nil {
					log.Printf("waiters=%d conns=%d handover=%v each=%v: %v", sh[0], sh[1], ho, each, err)
					failed = true
					continue
				}
				results = append(results, r)
				log.Printf("waiters=%d conns=%d handover=%v each=%v releases=%d: release-to-grant p50=%.0fus p99=%.0fus max=%.0fus; winners per release %d..%d; server CPU %.2f ms and %.1f statements per release (%s)",
					r.Waiters, r.Conns, r.Handover, r.Each, r.Releases, r.ReleaseGrant.P50, r.ReleaseGrant.P99, r.ReleaseGrant.Max, r.MinWinners, r.MaxWinners, r.CPUms, r.Statements, beside(r, results[0]))
			}
		}
	}
	if err := benchutil.WriteResults(*out, "waiters", results, report(results)); err != nil {
		log.Fatal(err)
	}
	if failed {
		os.Exit(1)
	}
}

type win struct {
	g  lease.Grant
	at time.Time
}

// beside says r's statements per release beside the baseline's (the first
// row) and, for a herd without a handover, the target's.
func beside(r, base result) string {
	s := fmt.Sprintf("baseline %d waiter(s): %.1f", base.Waiters, base.Statements)
	if r.Target > 0 {
		met := "met"
		if r.Statements > r.Target {
			met = "not met"
		}
		s += fmt.Sprintf("; target <= %.0f: %s", r.Target, met)
	}
	return s
}

func run(ctx context.Context, dsn string, nWaiters, nConns int, candidates, each bool) (result, error) {
	res := result{Waiters: nWaiters, Conns: nConns, Pool: min(*poolF, nWaiters+1), Releases: *releases, Handover: candidates, Each: each, Observe: *observeF}
	if nConns > 1 && !candidates && !each && *observeF {
		res.Target = statementTarget(nConns)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer admin.Close(context.Background())
	for _, q := range []string{`DELETE FROM lease.leases WHERE key = $1`, `DELETE FROM lease.candidates WHERE key = $1`,
		`DELETE FROM lease.strategies WHERE key = $1`} {
		if _, err := admin.Exec(ctx, q, key); err != nil {
			return res, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = int32(res.Pool)
	if *observeF {
		lease.ObserveCommits(&pcfg.ConnConfig.Config)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	c := lease.New(pool)
	if candidates {
		// Every waiter a ready candidate (registered in one statement on a
		// pool connection, which stays open for the run); the strategy
		// picks one per release.
		if _, err := handover.SetStrategy(ctx, c, key, handover.StrategyPriority); err != nil {
			return res, err
		}
		if _, err := pool.Exec(ctx, `SELECT lease.candidate($1, 'w' || i, interval '1 hour', priority => i % 7)
			FROM generate_series(0, $2 - 1) i`, key, nWaiters); err != nil {
			return res, err
		}
	}
	reads0, err := inspects(ctx, admin)
	if err != nil {
		return res, err
	}
	// (ten minutes: the herd's setup, on a loaded host, takes minutes)
	held, ok, err := c.Acquire(ctx, key, "driver", 10*time.Minute)
	if err != nil || !ok {
		return res, fmt.Errorf("driver's first grant: %v %v", ok, err)
	}
	ws := make([]*listen.Waiter, nConns)
	for i := range ws {
		if ws[i], err = listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{}); err != nil {
			return res, err
		}
		defer ws[i].Close()
	}
	wins := make(chan win, nWaiters)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := 0; i < nWaiters; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			follow(ctx, ws[i%nConns], c, "w"+strconv.Itoa(i), each, wins)
		}(i)
	}
	// Every listen connection registered the key, and the herd has read it
	// (each waiter's first read, which the rounds are not to count).
	for deadline := time.Now().Add(5 * time.Minute); ; {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM lease.listeners WHERE key = $1`, key).Scan(&n); err != nil {
			return res, err
		}
		reads, err := inspects(ctx, admin)
		if err != nil {
			return res, err
		}
		if n >= nConns && reads-reads0 >= int64(nWaiters) {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("only %d of %d listen connections registered %q, %d of %d waiters read it", n, nConns, key, reads-reads0, nWaiters)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(*settle)

	cpu0, st0, err := snapshot(ctx, admin)
	if err != nil {
		return res, err
	}
	var lat []float64
	res.MinWinners = 1 << 30
	for r := 0; r < *releases; r++ {
		t0 := time.Now()
		if err := c.Release(ctx, held.Token); err != nil {
			return res, fmt.Errorf("release %d: %w", r, err)
		}
		var first win
		select {
		case first = <-wins:
		case <-time.After(30 * time.Second):
			return res, fmt.Errorf("release %d: no winner within 30 s", r)
		}
		lat = append(lat, benchutil.Micros(first.at.Sub(t0)))
		time.Sleep(*settle)
		n := 1
		for more := true; more; {
			select {
			case <-wins:
				n++
			default:
				more = false
			}
		}
		res.MinWinners, res.MaxWinners = min(res.MinWinners, n), max(res.MaxWinners, n)
		if n != 1 {
			return res, fmt.Errorf("release %d: %d winners, want exactly one", r, n)
		}
		if first.g.Epoch <= held.Epoch {
			return res, fmt.Errorf("release %d: winner's epoch %d not above the released %d", r, first.g.Epoch, held.Epoch)
		}
		held = first.g
	}
	cpu1, st1, err := snapshot(ctx, admin)
	if err != nil {
		return res, err
	}
	rel := float64(*releases)
	res.CPUms = (cpu1 - cpu0) / rel
	res.Statements = float64(st1-st0-1) / rel // minus the snapshot's own statement
	res.ReleaseGrant = benchutil.Summarize(lat)
	res.Load = benchutil.LoadAvg()
	return res, nil
}

// follow is one waiter: it waits for the key and acquires it, each time
// it is free (the race) or handed to owner (a handover), until ctx ends,
// and sends each new grant to wins.
func follow(ctx context.Context, w *listen.Waiter, c *lease.Client, owner string, each bool, wins chan<- win) {
	var won int64 // the epoch this waiter last won
	for ctx.Err() == nil {
		if each {
			won = eachAcquires(ctx, w, c, owner, won, wins)
			continue
		}
		// Free (the race), or handed to this waiter (a handover).
		g, err := listen.AwaitAcquire(ctx, w, c, key, owner, time.Minute, 5*time.Second)
		if err != nil {
			continue
		}
		if g.Epoch > won {
			won = g.Epoch
			wins <- win{g, time.Now()}
		}
		// Held until the driver releases it.
		_, _ = listen.Await(ctx, w, c, key, 5*time.Second, func(s lease.State) bool {
			return !s.Held || s.Owner != owner || s.Epoch != g.Epoch
		})
	}
}

// eachAcquires is one round of a waiter that sends its own acquire: it
// waits until the key is free (the race) or handed to owner (a handover)
// with listen.Await, then acquires. It returns the epoch owner last won.
func eachAcquires(ctx context.Context, w *listen.Waiter, c *lease.Client, owner string, won int64, wins chan<- win) int64 {
	if _, err := listen.Await(ctx, w, c, key, 5*time.Second, func(s lease.State) bool {
		return !s.Held || (s.Owner == owner && s.Epoch > won)
	}); err != nil {
		return won
	}
	g, ok, err := c.Acquire(ctx, key, owner, time.Minute)
	if err == nil && ok && g.Epoch > won {
		wins <- win{g, time.Now()}
		return g.Epoch
	}
	return won
}

// clkTck is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux ABI Go supports).
const clkTck = 100

// minTicks is the least server CPU, in ticks over a whole row, from which a
// ratio to it is reported.
const minTicks = 20

// snapshot reads the server's CPU (ms, summed over every server process),
// and the statements executed (pg_stat_statements, top level: exact, unlike
// pg_stat_database's lazily flushed xact_commit).
func snapshot(ctx context.Context, admin *pgx.Conn) (cpuMs float64, statements int64, err error) {
	var pids []int32
	if err := admin.QueryRow(ctx, `SELECT array_agg(pid) FROM pg_stat_activity`).Scan(&pids); err != nil {
		return 0, 0, err
	}
	var ppid int32
	if err := admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&ppid); err != nil {
		return 0, 0, err
	}
	if pm, err := postmasterPID(ppid); err == nil {
		pids = append(pids, pm)
	}
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		// fields after the command: state(3) ... utime(14) stime(15)
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	if err := admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements`).Scan(&statements); err != nil {
		return 0, 0, err
	}
	return float64(ticks) * 1000 / clkTck, statements, nil
}

// inspects is the number of lease.inspect statements run so far.
func inspects(ctx context.Context, admin *pgx.Conn) (n int64, err error) {
	err = admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%lease.inspect(%'`).Scan(&n)
	return n, err
}

func postmasterPID(backend int32) (int32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	p, err := strconv.ParseInt(f[1], 10, 32)
	if err != nil {
		return 0, errors.New("no ppid")
	}
	return int32(p), nil
}

func report(rs []result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### waiters: many waiters on one key (release, herd, one winner)\n\n")
	fmt.Fprintf(&b, "| waiters | listen conns | pool | on release | acquires | releases | release-to-grant p50 µs | p99 µs | max µs | winners/release | server CPU ms/release | statements/release | beside | load |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		mode := "race"
		if r.Handover {
			mode = "handover"
		}
		acq := "shared per listen connection"
		if r.Each {
			acq = "one per waiter"
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %s | %d | %.0f | %.0f | %.0f | %d..%d | %.2f | %.1f | %s | %.1f |\n",
			r.Waiters, r.Conns, r.Pool, mode, acq, r.Releases, r.ReleaseGrant.P50, r.ReleaseGrant.P99, r.ReleaseGrant.Max,
			r.MinWinners, r.MaxWinners, r.CPUms, r.Statements, beside(r, rs[0]), r.Load)
	}
	if len(rs) >= 2 && rs[0].Statements > 0 && rs[0].ReleaseGrant.P50 > 0 {
		fmt.Fprintf(&b, "\nVs the first row (same run):\n\n")
		// The CPU is read in clock ticks (10 ms) summed over the run: a
		// first row with fewer than minTicks of them (smoke sizes) has no
		// ratio to give.
		cpuRatio := func(r result) string {
			if base := rs[0].CPUms * float64(rs[0].Releases); base < minTicks*1000/clkTck {
				return fmt.Sprintf("server CPU ratio n/a (the first row's %.0f ms in all is under %d ticks of %d ms)", base, minTicks, 1000/clkTck)
			}
			return fmt.Sprintf("server CPU %.1f×", r.CPUms/rs[0].CPUms)
		}
		for _, r := range rs[1:] {
			fmt.Fprintf(&b, "- %d waiters over %d (handover %v, each its own acquire %v): release-to-grant p50 %.2f×, p99 %.2f×; %s; statements %.1f×\n",
				r.Waiters, r.Conns, r.Handover, r.Each, r.ReleaseGrant.P50/rs[0].ReleaseGrant.P50, r.ReleaseGrant.P99/rs[0].ReleaseGrant.P99,
				cpuRatio(r), r.Statements/rs[0].Statements)
		}
	}
	return b.String()
}

// Command pglease-robustness runs pg_lease under randomized faults (server
// SIGKILL and restart, connection cuts and blackholes at a loopback proxy,
// SIGSTOP of client processes, server clock steps) and checks the history.
//
//	pglease-robustness -duration 5m -seed 42 -clients 8 -procs 4 -keys 3 -faults kill,proxy,stop,clock -out history.json
//	pglease-robustness -check history.json   # check a recorded history again
//
// A failing run prints its seed and the offending operations and exits 1.
//
//	pglease-robustness -hostile -duration 2m -seed 42   # the hostile-tenant mode
//
// -hostile runs the hostile-tenant mode instead (internal/robustness/hostile):
// honest electors, client-go locks, a sharded controller, handovers and
// free-key probes, each as a role of its own, while hostile roles act at
// random; -honest-only runs the honest parts alone (the control run).
// -sql (or $PGLEASE_ROBUSTNESS_SQL) installs another extension script as
// plain SQL instead of the repository's, for deliberate-defect runs.
// The command re-executes itself as a client worker process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/pg_lease/internal/robustness"
	"github.com/pglease/pg_lease/internal/robustness/hostile"
)

func main() {
	robustness.MaybeRunWorker()

	var (
		duration   = flag.Duration("duration", 60*time.Second, "how long the workload runs")
		seed       = flag.Int64("seed", 0, "seed of every random choice (0: from the clock; printed)")
		clients    = flag.Int("clients", 6, "clients, each with its own connection")
		procs      = flag.Int("procs", -1, "of which in worker processes (SIGSTOP targets); -1: half")
		keys       = flag.Int("keys", 3, "number of keys")
		faults     = flag.String("faults", "kill,proxy,stop,clock", "fault kinds: kill,proxy,stop,clock,failover (failover: asynchronous standby promoted; needs pg_lease 0.3.0), all (the first four) or none")
		out        = flag.String("out", "", "write the history (JSON lines) here")
		sqlFile    = flag.String("sql", os.Getenv(robustness.EnvSQL), "install this extension script (plain SQL) instead of the repository's")
		check      = flag.String("check", "", "only check this recorded history")
		linTimeout = flag.Duration("lin-timeout", 2*time.Minute, "porcupine time limit per key (negative: skip)")
		hostileRun = flag.Bool("hostile", false, "run the hostile-tenant mode (-duration, -seed; the other flags do not apply)")
		honestOnly = flag.Bool("honest-only", false, "with -hostile: the honest parts alone (the control run)")
		show       = flag.Int("show", 10, "with -hostile: the most violations of each check printed")
	)
	flag.Parse()

	if *hostileRun {
		os.Exit(runHostile(*seed, *duration, *honestOnly, *show))
	}

	if *check != "" {
		h, err := robustness.ReadHistoryFile(*check)
		if err != nil {
			fatal(err)
		}
		os.Exit(report(h, *linTimeout, ""))
	}

	kinds, err := robustness.ParseFaults(*faults)
	if err != nil {
		fatal(err)
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1_000_000_007
	}
	if *procs < 0 {
		*procs = *clients / 2
	}
	repro := fmt.Sprintf("go run ./cmd/pglease-robustness -seed %d -duration %v -clients %d -procs %d -keys %d -faults %s",
		*seed, *duration, *clients, *procs, *keys, strings.Join(kinds, ","))
	if *sqlFile != "" {
		repro += " -sql " + *sqlFile
	}
	fmt.Fprintf(os.Stderr, "pglease-robustness: seed %d\n  reproduce: %s\n", *seed, repro)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	h, err := robustness.Run(ctx, robustness.Config{
		Seed: *seed, Duration: *duration, Clients: *clients, Procs: *procs, Keys: *keys,
		Faults: kinds, SQLFile: *sqlFile,
		Logf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%7.2fs "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
		},
	})
	if *out != "" && h != nil {
		if werr := robustness.WriteHistoryFile(*out, h); werr != nil {
			fmt.Fprintln(os.Stderr, "writing history:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		if h == nil || len(h.Ops) == 0 {
			os.Exit(2)
		}
	}
	code := report(h, *linTimeout, repro)
	if err != nil && code == 0 {
		code = 2
	}
	os.Exit(code)
}

func report(h *robustness.History, linTimeout time.Duration, repro string) int {
	t := time.Now()
	res := robustness.Check(h, robustness.CheckOptions{LinTimeout: linTimeout})
	robustness.Summary(os.Stdout, h, res)
	fmt.Printf("check took %v\n", time.Since(t).Round(time.Millisecond))
	if len(res.Violations) == 0 {
		return 0
	}
	robustness.Report(os.Stdout, h, res, 10)
	fmt.Printf("\nFAILED with seed %d\n", h.Meta.Seed)
	if repro != "" {
		fmt.Printf("reproduce: %s\n", repro)
	}
	return 1
}

// runHostile runs the hostile-tenant mode and returns the exit code.
func runHostile(seed int64, duration time.Duration, honestOnly bool, show int) int {
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000_007
	}
	repro := fmt.Sprintf("go run ./cmd/pglease-robustness -hostile -seed %d -duration %v", seed, duration)
	if honestOnly {
		repro += " -honest-only"
	}
	fmt.Fprintf(os.Stderr, "pglease-robustness: hostile tenants, seed %d\n  reproduce: %s\n", seed, repro)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := hostile.Run(ctx, hostile.Config{Seed: seed, Duration: duration, HonestOnly: honestOnly,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 2
	}
	res.Report(os.Stdout, show)
	if len(res.Violations) > 0 {
		fmt.Printf("\nFAILED with seed %d\nreproduce: %s\n", seed, repro)
		return 1
	}
	return 0
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "pglease-robustness:", err)
	os.Exit(2)
}

package robustness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// EnvWorker, when set in a process's environment, makes MaybeRunWorker run
// one client (the JSON ClientConfig in the variable) and exit, writing its
// operations to stdout as JSON lines.
const EnvWorker = "PGLEASE_ROBUSTNESS_WORKER"

// EnvSQL names an extension install script to use instead of the
// repository's (the deliberate-defect harness points it at a modified copy).
const EnvSQL = "PGLEASE_ROBUSTNESS_SQL"

// MaybeRunWorker runs a worker client and exits if EnvWorker is set; call it
// first in main and TestMain.
func MaybeRunWorker() {
	v := os.Getenv(EnvWorker)
	if v == "" {
		return
	}
	var cfg ClientConfig
	if err := json.Unmarshal([]byte(v), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "robustness worker:", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	var mu sync.Mutex
	RunClient(context.Background(), cfg, func(op Op) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(line{Op: &op})
		_ = out.Flush()
	})
	os.Exit(0)
}

// Config is one run.
type Config struct {
	Seed     int64
	Duration time.Duration
	Clients  int      // in all
	Procs    int      // of which in worker processes
	Keys     int      // number of keys
	Faults   []string // kinds to inject
	// SQLFile, when set, is installed (as plain SQL, without CREATE
	// EXTENSION) instead of the repository's extension. Default: $PGLEASE_ROBUSTNESS_SQL.
	SQLFile string
	// WorkerCommand returns the command of a worker process (its
	// environment gets EnvWorker added). Default: this executable.
	WorkerCommand func() *exec.Cmd
	Logf          func(format string, args ...any)
}

// TTLs per key: short, and different so that keys lapse at different rates.
var keyTTLs = []time.Duration{500 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond, 700 * time.Millisecond}

// maxKeyTTL is the max_ttl configured for failover runs: at least every
// key's TTL (the promotion grace).
const maxKeyTTL = 2 * time.Second

func (c *Config) defaults() {
	if c.Duration == 0 {
		c.Duration = 60 * time.Second
	}
	if c.Clients == 0 {
		c.Clients = 6
	}
	if c.Procs > c.Clients {
		c.Procs = c.Clients
	}
	if c.Keys == 0 {
		c.Keys = 3
	}
	if c.SQLFile == "" {
		c.SQLFile = os.Getenv(EnvSQL)
	}
	if c.WorkerCommand == nil {
		c.WorkerCommand = func() *exec.Cmd {
			exe, err := os.Executable()
			if err != nil {
				exe = os.Args[0]
			}
			return exec.Command(exe)
		}
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ParseFaults parses "kill,proxy,stop,clock" ("all" and "none" allowed).
func ParseFaults(s string) ([]string, error) {
	switch s {
	case "all":
		return append([]string(nil), AllFaults...), nil
	case "", "none":
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !has(KnownFaults, f) {
			return nil, fmt.Errorf("unknown fault kind %q (want %s)", f, strings.Join(KnownFaults, ","))
		}
		out = append(out, f)
	}
	return out, nil
}

// installSQL runs a (possibly modified) extension script as plain SQL.
func installSQL(ctx context.Context, conn *pgx.Conn, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var sb strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), `\`) {
			continue
		}
		sb.WriteString(l)
	}
	script := strings.ReplaceAll(sb.String(), "@extowner@", pgserver.Superuser)
	_, err = conn.Exec(ctx, script)
	return err
}

// Run starts a throwaway server, runs the workload and the faults for
// cfg.Duration, and returns the history (also when err is non-nil, as far
// as it got).
func Run(ctx context.Context, cfg Config) (h *History, err error) {
	cfg.defaults()
	h = &History{Meta: Meta{Seed: cfg.Seed, Clients: cfg.Clients, Procs: cfg.Procs, Faults: cfg.Faults,
		Duration: cfg.Duration.String(), SQLFile: cfg.SQLFile}}
	for i := 0; i < cfg.Keys; i++ {
		h.Meta.Keys = append(h.Meta.Keys, fmt.Sprintf("k%d", i))
	}

	srv, err := pgserver.Start(ctx, pgserver.Options{
		FakeClock: has(cfg.Faults, FaultClock),
		Settings:  map[string]string{"max_connections": "100", "log_min_messages": "fatal"},
	})
	if err != nil {
		return h, err
	}
	cl := &cluster{primary: srv, clock: has(cfg.Faults, FaultClock)}
	defer cl.close()
	if has(cfg.Faults, FaultClock) {
		if err := srv.SetClockOffset(0); err != nil {
			return h, err
		}
	}
	dsn, err := srv.CreateDatabase(ctx, "robust")
	if err != nil {
		return h, err
	}
	if err := setup(ctx, srv, dsn, cfg.SQLFile, h.Meta.Keys); err != nil {
		return h, err
	}
	failover := has(cfg.Faults, FaultFailover)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return h, err
	}
	if failover {
		err = configureGrace(ctx, conn, maxKeyTTL)
	} else {
		err = configureSingleServer(ctx, conn)
	}
	conn.Close(context.Background())
	if err != nil {
		return h, err
	}
	if failover {
		if err := cl.addStandby(ctx); err != nil {
			return h, err
		}
	}

	proxy, err := NewProxy(net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port())))
	if err != nil {
		return h, err
	}
	defer proxy.Close()
	cl.proxy = proxy
	clientDSN := fmt.Sprintf("postgres://%s@127.0.0.1:%d/robust?sslmode=disable", pgserver.Superuser, proxy.Port())

	var (
		mu  sync.Mutex
		ops []Op
	)
	emit := func(op Op) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}
	start := Mono()
	until := start + int64(cfg.Duration)
	h.Meta.Start = start
	ttls := make([]time.Duration, cfg.Keys)
	for i := range ttls {
		ttls[i] = keyTTLs[i%len(keyTTLs)]
	}
	ccfg := func(id int) ClientConfig {
		return ClientConfig{ID: id, Seed: cfg.Seed*1_000_003 + int64(id), DSN: clientDSN, Keys: h.Meta.Keys, TTLs: ttls, Until: until}
	}

	var wg sync.WaitGroup
	// Worker processes first: clients 0..Procs-1.
	var cmds []*exec.Cmd
	var pids []int
	for id := 0; id < cfg.Procs; id++ {
		b, _ := json.Marshal(ccfg(id))
		cmd := cfg.WorkerCommand()
		cmd.Env = append(os.Environ(), EnvWorker+"="+string(b))
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return h, err
		}
		if err := cmd.Start(); err != nil {
			return h, fmt.Errorf("starting worker %d: %w", id, err)
		}
		cmds = append(cmds, cmd)
		pids = append(pids, cmd.Process.Pid)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var l line
				if json.Unmarshal(sc.Bytes(), &l) == nil && l.Op != nil {
					emit(*l.Op)
				}
			}
		}()
	}
	defer func() {
		for _, c := range cmds {
			if c.ProcessState == nil {
				_ = c.Process.Signal(syscall.SIGCONT)
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		}
	}()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for id := cfg.Procs; id < cfg.Clients; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			RunClient(cctx, ccfg(id), emit)
		}()
	}

	inj := &Injector{Server: cl, Proxy: proxy, Pids: pids, Logf: cfg.Logf}
	if failover {
		inj.Failover = cl.failover
	}
	plan := Plan(cfg.Seed, cfg.Duration, cfg.Faults, cfg.Procs)
	faults := inj.Run(ctx, start, plan)
	h.Faults = faults
	proxy.Open()
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGCONT)
	}

	// Workers end by themselves at until (+ barrier time); bound the wait.
	done := make(chan struct{})
	go func() {
		wg.Wait() // readers end at the workers' EOF; then reap them
		for _, c := range cmds {
			_ = c.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(cfg.Duration/4 + 40*time.Second):
		err = errors.New("clients did not finish in time; killed")
		cancel()
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
		<-done
	}
	h.Meta.End = Mono()
	mu.Lock()
	h.Ops = ops
	mu.Unlock()
	h.Sort()
	return h, err
}

func setup(ctx context.Context, srv *pgserver.Server, dsn, sqlFile string, keys []string) error {
	if sqlFile == "" {
		if err := srv.InstallExtensionFiles(ctx); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if sqlFile == "" {
		if _, err := conn.Exec(ctx, `CREATE EXTENSION pg_lease`); err != nil {
			return err
		}
	} else if err := installSQL(ctx, conn, sqlFile); err != nil {
		return fmt.Errorf("installing %s: %w", sqlFile, err)
	}
	_, err = conn.Exec(ctx, GuardSchema(keys))
	return err
}

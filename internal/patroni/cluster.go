package patroni

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// Mode is the replication mode Patroni enforces.
type Mode string

// The three modes (see the package documentation).
const (
	Async  Mode = "async"
	Sync   Mode = "sync"
	Strict Mode = "strict"
)

// Superuser is the role every node is reached as (trust on 127.0.0.1).
const Superuser = "postgres"

// ErrNoLeader: the cluster has no running primary that every member agrees on.
var ErrNoLeader = errors.New("patroni: no healthy leader")

// Options configure Start.
type Options struct {
	Mode Mode
	// Nodes in the cluster (default 3).
	Nodes int
	// Etcd is the etcd server binary (required).
	Etcd string
	// Supervise is the binary of this package's supervise program
	// (required; for example built with pgtest.BuildProgram).
	Supervise string
	// Patroni and Patronictl default to the commands on PATH.
	Patroni, Patronictl string
	// BinDir holds the PostgreSQL server binaries (default:
	// pgserver.FindBinDir).
	BinDir string
	// TTL, LoopWait and RetryTimeout are Patroni's (seconds; defaults 5,
	// 1 and 2).
	TTL, LoopWait, RetryTimeout int
	// Parameters are PostgreSQL settings added to the defaults.
	Parameters map[string]string
	// NoSlots runs Patroni with use_slots false: standbys stream without
	// a replication slot (wal_keep_size keeps their WAL). With slots, a new
	// primary creates its standbys' slots only in an HA cycle after its
	// promotion, and a standby cannot stream from it before; unless
	// LateSlots is set, each node therefore has a pre_promote script that
	// creates the other nodes' slots on it just before Patroni promotes it
	// (psql from BinDir, or on PATH). The script always exits 0: a slot it
	// could not create is left to Patroni, and never stops a promotion.
	NoSlots bool
	// LateSlots leaves a new primary's slots to Patroni alone (no
	// pre_promote script): the standbys stream from it a cycle or two after
	// its promotion.
	LateSlots bool
	// Dir is the parent of the cluster's temporary directory (default
	// os.TempDir()); it must be searchable by nobody when root.
	Dir string
	// StartTimeout bounds Start and Node.Start (default 2 minutes).
	StartTimeout time.Duration

	psql string // the pre_promote script's psql
}

func (o *Options) withDefaults() error {
	switch o.Mode {
	case Async, Sync, Strict:
	case "":
		o.Mode = Async
	default:
		return fmt.Errorf("patroni: Options.Mode must be async, sync or strict, got %q", o.Mode)
	}
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 1 || o.Nodes > 9 {
		return fmt.Errorf("patroni: Options.Nodes must be 1..9, got %d", o.Nodes)
	}
	if o.Etcd == "" {
		return errors.New("patroni: Options.Etcd (the etcd server binary) is required")
	}
	if o.Supervise == "" {
		return errors.New("patroni: Options.Supervise (the supervise program) is required")
	}
	for _, p := range []*string{&o.Patroni, &o.Patronictl} {
		name := "patroni"
		if p == &o.Patronictl {
			name = "patronictl"
		}
		if *p == "" {
			path, err := exec.LookPath(name)
			if err != nil {
				return fmt.Errorf("patroni: %s is not on PATH: install Debian's patroni package (apt-get install patroni)", name)
			}
			*p = path
		}
	}
	if o.BinDir == "" {
		d, err := pgserver.FindBinDir()
		if err != nil {
			return err
		}
		o.BinDir = d
	}
	if !o.NoSlots && !o.LateSlots && o.psql == "" {
		o.psql = filepath.Join(o.BinDir, "psql")
		if _, err := os.Stat(o.psql); err != nil {
			if o.psql, err = exec.LookPath("psql"); err != nil {
				return fmt.Errorf("patroni: no psql in %s nor on PATH, needed by the pre_promote script that creates a new primary's slots (install postgresql-client, or set Options.LateSlots)", o.BinDir)
			}
		}
	}
	if o.TTL == 0 {
		o.TTL = 5
	}
	if o.LoopWait == 0 {
		o.LoopWait = 1
	}
	if o.RetryTimeout == 0 {
		o.RetryTimeout = 2
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 2 * time.Minute
	}
	return nil
}

// nodeName is the name of the i-th node (also its replication slot's
// name: Patroni names a member's slot after it).
func nodeName(i int) string { return fmt.Sprintf("node%d", i) }

// Cluster is a running etcd and its Patroni nodes.
type Cluster struct {
	opts  Options
	root  string
	scope string
	cred  *syscall.Credential
	etcd  *exec.Cmd
	etcdD chan struct{}
	ePort int
	pPort int // etcd's peer port
	etcdM sync.Mutex
	nodes []*Node
}

// Start creates the cluster's directory, starts etcd and every node, and
// waits until one node leads and every other streams from it.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, scope: "pglease-ha"}
	if c.cred, err = pgserver.UnprivilegedCredential(); err != nil {
		return nil, err
	}
	if c.root, err = os.MkdirTemp(opts.Dir, "patroni-"); err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	// A failed start returns nil: close what was started through a copy.
	started := c
	defer func() {
		if err != nil {
			_ = started.Close()
			c = nil
		}
	}()
	if err := c.chown(c.root); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.root, 0o755); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	secret := make([]byte, 12)
	_, _ = rand.Read(secret)
	for i := range opts.Nodes {
		n := &Node{c: c, Name: nodeName(i), password: hex.EncodeToString(secret)}
		n.dir = filepath.Join(c.root, n.Name)
		if n.Port, err = freePort(); err != nil {
			return nil, err
		}
		if n.RESTPort, err = freePort(); err != nil {
			return nil, err
		}
		for _, d := range []string{n.dir, n.sockDir()} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, err
			}
			if err := c.chown(d); err != nil {
				return nil, err
			}
		}
		if err := n.writeConfig(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	// The first node bootstraps alone (initdb); the others then copy it.
	if err := c.nodes[0].Start(ctx); err != nil {
		return nil, err
	}
	if _, err := c.waitLeader(ctx); err != nil {
		return nil, err
	}
	for _, n := range c.nodes[1:] {
		if err := n.Start(ctx); err != nil {
			return nil, err
		}
	}
	if _, err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) chown(p string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(p, int(c.cred.Uid), int(c.cred.Gid))
}

// Nodes returns the nodes in name order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Mode is the cluster's replication mode.
func (c *Cluster) Mode() Mode { return c.opts.Mode }

// Dir is the cluster's temporary directory (node logs: <node>/patroni.log).
func (c *Cluster) Dir() string { return c.root }

// MultiHostDSN lists every node, with target_session_attrs=read-write: a
// client connects to whichever node accepts writes.
func (c *Cluster) MultiHostDSN(db string) string {
	hosts, ports := make([]string, len(c.nodes)), make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(n.Port)
	}
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2",
		strings.Join(hosts, ","), strings.Join(ports, ","), Superuser, db)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	c.etcdM.Lock()
	defer c.etcdM.Unlock()
	if c.etcd != nil {
		return errors.New("patroni: etcd is already running")
	}
	if c.ePort == 0 {
		var err error
		if c.ePort, err = freePort(); err != nil {
			return err
		}
		if c.pPort, err = freePort(); err != nil {
			return err
		}
	}
	peer := c.pPort
	dir := filepath.Join(c.root, "etcd")
	logf, err := os.OpenFile(filepath.Join(c.root, "etcd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	client := fmt.Sprintf("http://127.0.0.1:%d", c.ePort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command(c.opts.Etcd, "--name", "default", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("patroni: starting etcd: %w", err)
	}
	done := make(chan struct{})
	c.etcd, c.etcdD = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(client + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"true"`) {
				return nil
			}
		}
		select {
		case <-done:
			c.etcd = nil
			return fmt.Errorf("patroni: etcd exited at start; log:\n%s", tail(filepath.Join(c.root, "etcd.log")))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("patroni: etcd not healthy after a minute; log:\n%s", tail(filepath.Join(c.root, "etcd.log")))
		}
	}
}

// StopEtcd kills etcd (SIGKILL), Patroni's DCS, and waits until it is
// gone: every node loses the DCS. StartEtcd starts it again on the same
// data directory and ports.
func (c *Cluster) StopEtcd() error {
	c.etcdM.Lock()
	defer c.etcdM.Unlock()
	if c.etcd == nil {
		return errors.New("patroni: etcd is not running")
	}
	_ = c.etcd.Process.Kill()
	<-c.etcdD
	c.etcd = nil
	return nil
}

// StartEtcd starts etcd again after StopEtcd and waits until it is healthy.
func (c *Cluster) StartEtcd(ctx context.Context) error { return c.startEtcd(ctx) }

// Close stops every node (Patroni stops PostgreSQL), then etcd, and
// removes the directory.
func (c *Cluster) Close() error {
	var errs []error
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() {
			if err := n.Stop(); err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	c.etcdM.Lock()
	if c.etcd != nil {
		_ = c.etcd.Process.Kill()
		<-c.etcdD
		c.etcd = nil
	}
	c.etcdM.Unlock()
	if c.root != "" && os.Getenv("PGLEASE_KEEP_HA") == "" {
		if err := os.RemoveAll(c.root); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Member is one node as Patroni's GET /cluster reports it.
type Member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby, replica
	State    string `json:"state"` // running, streaming, starting, stopped, ...
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"`
}

// Members asks the REST API of the first node that answers for the
// cluster's members as the DCS holds them.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var lastErr error
	for _, n := range c.nodes {
		if !n.Running() || n.Frozen() {
			continue
		}
		var out struct {
			Members []Member `json:"members"`
		}
		if err := n.rest(ctx, "GET", "/cluster", &out); err != nil {
			lastErr = err
			continue
		}
		sort.Slice(out.Members, func(i, j int) bool { return out.Members[i].Name < out.Members[j].Name })
		return out.Members, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no node is running")
	}
	return nil, fmt.Errorf("patroni: GET /cluster: %w", lastErr)
}

// waitLeader waits until some node leads and its PostgreSQL accepts writes.
func (c *Cluster) waitLeader(ctx context.Context) (*Node, error) {
	var last string
	for {
		if ms, err := c.Members(ctx); err == nil {
			for _, m := range ms {
				if m.Role == "leader" && m.State == "running" {
					if n := c.Node(m.Name); n != nil && n.writable(ctx) {
						return n, nil
					}
				}
			}
			last = fmt.Sprintf("%+v", ms)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v (last: %s)", ErrNoLeader, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitHealthy waits until every running node is a member, one leads and
// accepts writes, every other running node streams from it on its
// timeline, and (in the synchronous modes, with a replica running) one
// replica is the synchronous standby. It returns the leader.
func (c *Cluster) WaitHealthy(ctx context.Context) (*Node, error) {
	var last string
	for {
		leader, why := c.healthy(ctx)
		if leader != nil {
			return leader, nil
		}
		last = why
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v (last: %s)", ErrNoLeader, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) (*Node, string) {
	ms, err := c.Members(ctx)
	if err != nil {
		return nil, err.Error()
	}
	byName := map[string]Member{}
	var leader *Node
	var lm Member
	for _, m := range ms {
		byName[m.Name] = m
		if m.Role == "leader" {
			leader, lm = c.Node(m.Name), m
		}
	}
	if leader == nil || lm.State != "running" {
		return nil, fmt.Sprintf("no running leader: %+v", ms)
	}
	want, sync := 0, false
	for _, n := range c.nodes {
		if n == leader || !n.Running() {
			continue
		}
		want++
		m, ok := byName[n.Name]
		if !ok || (m.State != "running" && m.State != "streaming") || m.Timeline != lm.Timeline {
			return nil, fmt.Sprintf("%s not following %s on timeline %d: %+v", n.Name, leader.Name, lm.Timeline, ms)
		}
		if m.Role == "sync_standby" {
			sync = true
		}
	}
	if c.opts.Mode != Async && want > 0 && !sync {
		return nil, fmt.Sprintf("no synchronous standby: %+v", ms)
	}
	// Every running replica streams from the leader (its REST view can lag).
	conn, err := leader.Connect(ctx, "postgres")
	if err != nil {
		return nil, err.Error()
	}
	defer conn.Close(context.Background())
	var streaming int
	var inRecovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming')`).Scan(&inRecovery, &streaming); err != nil {
		return nil, err.Error()
	}
	if inRecovery || streaming < want {
		return nil, fmt.Sprintf("leader %s: in recovery %v, %d of %d replicas streaming", leader.Name, inRecovery, streaming, want)
	}
	return leader, ""
}

// Switchover asks Patroni for a planned switchover from leader to
// candidate (patronictl switchover --leader --candidate --force) and
// returns when patronictl does (the switchover is then done or failed).
func (c *Cluster) Switchover(ctx context.Context, leader, candidate *Node) error {
	cmd := exec.CommandContext(ctx, c.opts.Patronictl, "-c", leader.cfgPath(), "switchover",
		"--leader", leader.Name, "--candidate", candidate.Name, "--force", c.scope)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("patroni: patronictl switchover %s -> %s: %w\n%s", leader.Name, candidate.Name, err, out)
	}
	if !strings.Contains(string(out), "Successfully switched over") {
		return fmt.Errorf("patroni: patronictl switchover %s -> %s did not switch over:\n%s", leader.Name, candidate.Name, out)
	}
	return nil
}

// Connect opens a connection to database db on the node.
func (n *Node) Connect(ctx context.Context, db string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(n.DSN(db))
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 2 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

func (n *Node) writable(ctx context.Context) bool {
	conn, err := n.Connect(ctx, "postgres")
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var rec bool
	return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec) == nil && !rec
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const max = 6000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

package patroni

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// Node is one Patroni process and the PostgreSQL it manages.
type Node struct {
	c        *Cluster
	Name     string
	Port     int // PostgreSQL
	RESTPort int // Patroni's REST API
	dir      string
	password string

	mu      sync.Mutex
	tags    map[string]any
	sup     *exec.Cmd
	supDone chan struct{}
	supKeep chan struct{} // the supervisor acknowledged SIGUSR1
	patroni int           // pid
	frozen  []int
	// orphaned: supervisors whose Patroni was killed alone (KillPatroni),
	// still reaping the postmaster it left; each channel closes when its
	// supervisor exits.
	orphaned []chan struct{}
}

func (n *Node) cfgPath() string   { return filepath.Join(n.dir, "patroni.yml") }
func (n *Node) sockDir() string   { return filepath.Join(n.dir, "sock") }
func (n *Node) dataDir() string   { return filepath.Join(n.dir, "data") }
func (n *Node) LogPath() string   { return filepath.Join(n.dir, "patroni.log") }
func (n *Node) String() string    { return n.Name }
func (n *Node) restURL() string   { return fmt.Sprintf("http://127.0.0.1:%d", n.RESTPort) }
func (n *Node) DataDir() string   { return n.dataDir() }
func (n *Node) LogTail() string   { return tail(n.LogPath()) }
func (n *Node) Cluster() *Cluster { return n.c }

// DSN reaches database db on this node only.
func (n *Node) DSN(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable connect_timeout=2", n.Port, Superuser, db)
}

// writeConfig writes the node's Patroni configuration (JSON, which is YAML).
func (n *Node) writeConfig() error {
	o := n.c.opts
	params := map[string]any{
		"wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
		"max_wal_senders": 10, "max_replication_slots": 10, "wal_keep_size": "128MB",
		"shared_buffers": "32MB", "dynamic_shared_memory_type": "mmap", "timezone": "UTC",
		"max_connections": 100, "log_line_prefix": "%m [%p] ", "logging_collector": "off",
		// A standby that lost its primary tries again every 5 s by default;
		// in strict synchronous mode every commit on a new primary waits
		// that long for a standby to reconnect.
		"wal_retrieve_retry_interval": "250ms",
	}
	for k, v := range o.Parameters {
		params[k] = v
	}
	hba := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication replicator 127.0.0.1/32 trust",
	}
	cfg := map[string]any{
		"scope": n.c.scope,
		"name":  n.Name,
		"log":   map[string]any{"level": "INFO", "format": "%(asctime)s " + n.Name + " %(levelname)s: %(message)s"},
		"restapi": map[string]any{
			"listen":          fmt.Sprintf("127.0.0.1:%d", n.RESTPort),
			"connect_address": fmt.Sprintf("127.0.0.1:%d", n.RESTPort),
		},
		"etcd3": map[string]any{"hosts": fmt.Sprintf("127.0.0.1:%d", n.c.ePort)},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": o.TTL, "loop_wait": o.LoopWait, "retry_timeout": o.RetryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"synchronous_mode":        o.Mode != Async,
				"synchronous_mode_strict": o.Mode == Strict,
				"synchronous_node_count":  1,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     !o.NoSlots,
					"parameters":    params,
				},
			},
			"initdb": []any{map[string]any{"encoding": "UTF8"}, map[string]any{"locale": "C"}},
		},
		"postgresql": map[string]any{
			"listen":          fmt.Sprintf("127.0.0.1:%d", n.Port),
			"connect_address": fmt.Sprintf("127.0.0.1:%d", n.Port),
			"data_dir":        n.dataDir(),
			"bin_dir":         o.BinDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": Superuser, "password": n.password},
				"replication": map[string]any{"username": "replicator", "password": n.password},
			},
			"parameters": map[string]any{"unix_socket_directories": n.sockDir()},
			"pg_hba":     hba,
			"basebackup": []any{map[string]any{"checkpoint": "fast"}},
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
	}
	if !o.NoSlots && !o.LateSlots {
		script, err := n.writePrePromote()
		if err != nil {
			return err
		}
		// Patroni splits the command as a shell would.
		cfg["postgresql"].(map[string]any)["pre_promote"] = shellQuote(script)
	}
	if n.tags != nil {
		cfg["tags"] = n.tags
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.cfgPath(), b, 0o600); err != nil {
		return err
	}
	return n.c.chown(n.cfgPath())
}

// writePrePromote writes the node's pre_promote script: it creates the
// other nodes' replication slots on this node, a standby that Patroni is
// about to promote, so that they can stream from it as soon as it is
// promoted (Patroni 3.0 creates them in an HA cycle after the promotion,
// and in strict mode every commit on the new primary waits for a standby).
// A physical slot can be created on a standby and outlives the promotion;
// Patroni then finds the slots it expects. The script always exits 0:
// Patroni aborts a promotion whose pre_promote fails.
func (n *Node) writePrePromote() (string, error) {
	o := n.c.opts
	var slots []string
	for i := range o.Nodes {
		if name := nodeName(i); name != n.Name {
			slots = append(slots, "'"+name+"'")
		}
	}
	sql := "SELECT pg_catalog.pg_create_physical_replication_slot(s, true) FROM unnest(ARRAY[" +
		strings.Join(slots, ",") + "]::text[]) AS s WHERE NOT EXISTS " +
		"(SELECT FROM pg_catalog.pg_replication_slots r WHERE r.slot_name = s)"
	script := "#!/bin/sh\n" +
		"# Patroni's pre_promote: the other nodes' slots, before this node is promoted.\n" +
		"# Bounded: Patroni waits for it while it holds the leader key.\n" +
		"PGCONNECT_TIMEOUT=5 PGOPTIONS='-c statement_timeout=5s' " + shellQuote(o.psql) + " -X -q -w -h " + shellQuote(n.sockDir()) + " -p " + strconv.Itoa(n.Port) +
		" -U " + Superuser + " -d postgres -c " + shellQuote(sql) + " >/dev/null 2>&1\n" +
		"exit 0\n"
	path := filepath.Join(n.dir, "pre_promote.sh")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		return "", err
	}
	return path, n.c.chown(path)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// SetTags replaces the node's Patroni tags (nosync, nofailover, ...; nil:
// none) and makes a running Patroni reload its configuration (SIGHUP).
func (n *Node) SetTags(tags map[string]any) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.tags = tags
	if err := n.writeConfig(); err != nil {
		return err
	}
	if n.sup != nil && n.frozen == nil {
		return syscall.Kill(n.patroni, syscall.SIGHUP)
	}
	return nil
}

// Running reports whether the node's Patroni runs (frozen counts).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sup != nil
}

// Frozen reports whether the node is stopped by Freeze.
func (n *Node) Frozen() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frozen != nil
}

// PostmasterPID is the running postmaster's pid, or 0.
func (n *Node) PostmasterPID() int { return pgserver.PostmasterPID(n.dataDir()) }

// Start starts Patroni on the node (again, after Kill or Stop: on the same
// data directory) and waits until its REST API answers.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sup != nil {
		return fmt.Errorf("patroni: %s is already running", n.Name)
	}
	logf, err := os.OpenFile(n.LogPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{}
	if cred := n.c.cred; cred != nil {
		args = append(args, "-uid", strconv.Itoa(int(cred.Uid)), "-gid", strconv.Itoa(int(cred.Gid)))
	}
	args = append(args, "--", n.c.opts.Patroni, n.cfgPath())
	cmd := exec.Command(n.c.opts.Supervise, args...)
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8", "HOME="+n.dir, "PYTHONUNBUFFERED=1")
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("patroni: starting %s: %w", n.Name, err)
	}
	done := make(chan struct{})
	pidc := make(chan int, 1)
	keep := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		kept := false
		for sc.Scan() {
			var pid int
			if _, err := fmt.Sscanf(sc.Text(), "pid %d", &pid); err == nil {
				pidc <- pid
			} else if sc.Text() == "keep" && !kept {
				kept = true
				close(keep)
			}
		}
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case pid := <-pidc:
		n.sup, n.supDone, n.supKeep, n.patroni, n.frozen = cmd, done, keep, pid, nil
	case <-done:
		return fmt.Errorf("patroni: %s exited at start; log:\n%s", n.Name, n.LogTail())
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
	for {
		var v map[string]any
		if err := n.rest(ctx, "GET", "/patroni", &v); err == nil {
			return nil
		} else if !errors.Is(err, errUnavailable) {
			return err
		}
		select {
		case <-done:
			n.sup = nil
			return fmt.Errorf("patroni: %s exited at start; log:\n%s", n.Name, n.LogTail())
		case <-ctx.Done():
			return fmt.Errorf("patroni: %s: REST API not up: %w; log:\n%s", n.Name, ctx.Err(), n.LogTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

var errUnavailable = errors.New("unavailable")

// rest calls the node's REST API and decodes its JSON answer into out
// (any status; Patroni answers 503 with a body on replicas).
func (n *Node) rest(ctx context.Context, method, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, n.restURL()+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w: %v", n.Name, path, errUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: %d %q: %w", n.Name, path, resp.StatusCode, b, err)
	}
	return nil
}

// Stop stops Patroni with SIGTERM (Patroni stops PostgreSQL, fast
// shutdown) and waits; after a minute it kills both.
func (n *Node) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sup == nil {
		return n.stopOrphanedLocked()
	}
	n.thawLocked()
	_ = n.sup.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.supDone:
	case <-time.After(time.Minute):
		err := n.killLocked()
		return errors.Join(fmt.Errorf("patroni: %s did not stop within a minute; killed", n.Name), err)
	}
	n.sup = nil
	return n.stopOrphanedLocked()
}

// stopOrphanedLocked kills a postmaster that outlived its Patroni and no
// Patroni adopted, and waits for the supervisors still reaping one.
func (n *Node) stopOrphanedLocked() error {
	if len(n.orphaned) == 0 {
		return nil
	}
	var err error
	if pm := n.PostmasterPID(); pm != 0 && n.sup == nil {
		err = pgserver.KillTree(pm)
	}
	for _, d := range n.orphaned {
		select {
		case <-d:
		case <-time.After(30 * time.Second):
			err = errors.Join(err, fmt.Errorf("patroni: %s: a supervisor of a killed Patroni did not exit", n.Name))
		}
	}
	n.orphaned = nil
	return err
}

// KillPatroni kills the node's Patroni alone (SIGKILL), as the OOM killer
// would: its PostgreSQL keeps running, without an HA manager, until a
// Patroni started again (Start) takes it over. The supervisor keeps
// reaping the postmaster and exits when it is gone.
func (n *Node) KillPatroni() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sup == nil || n.frozen != nil {
		return fmt.Errorf("patroni: KillPatroni: %s is not running", n.Name)
	}
	if err := n.sup.Process.Signal(syscall.SIGUSR1); err != nil {
		return fmt.Errorf("patroni: KillPatroni %s: %w", n.Name, err)
	}
	select {
	case <-n.supKeep:
	case <-n.supDone:
		return fmt.Errorf("patroni: KillPatroni: %s's supervisor exited", n.Name)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("patroni: KillPatroni: %s's supervisor did not answer SIGUSR1", n.Name)
	}
	if err := syscall.Kill(n.patroni, syscall.SIGKILL); err != nil {
		return fmt.Errorf("patroni: KillPatroni %s: %w", n.Name, err)
	}
	n.orphaned = append(n.orphaned, n.supDone)
	n.sup, n.supDone, n.supKeep = nil, nil, nil
	return nil
}

// Kill crashes the node: SIGKILL of Patroni and of the postmaster with
// every backend, with neither able to react in between (both are stopped
// first). The supervisor reaps them and exits.
func (n *Node) Kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killLocked()
}

func (n *Node) killLocked() error {
	if n.sup == nil {
		if len(n.orphaned) > 0 {
			return n.stopOrphanedLocked()
		}
		return fmt.Errorf("patroni: Kill: %s is not running", n.Name)
	}
	_ = syscall.Kill(n.patroni, syscall.SIGSTOP)
	var err error
	if pm := n.PostmasterPID(); pm != 0 {
		err = pgserver.KillTree(pm)
	}
	_ = syscall.Kill(n.patroni, syscall.SIGKILL)
	select {
	case <-n.supDone:
	case <-time.After(30 * time.Second):
		_ = n.sup.Process.Kill()
		<-n.supDone
		err = errors.Join(err, fmt.Errorf("patroni: %s: the supervisor did not exit after the kill", n.Name))
	}
	n.sup, n.frozen = nil, nil
	return errors.Join(err, n.stopOrphanedLocked())
}

// Freeze stops the node with SIGSTOP: Patroni, the postmaster and every
// backend, as a paused machine. Connections stay open and hang; the leader
// key in etcd is no longer renewed.
func (n *Node) Freeze() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sup == nil {
		return fmt.Errorf("patroni: Freeze: %s is not running", n.Name)
	}
	if n.frozen != nil {
		return nil
	}
	if err := syscall.Kill(n.patroni, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("patroni: Freeze %s: %w", n.Name, err)
	}
	n.frozen = []int{n.patroni}
	if pm := n.PostmasterPID(); pm != 0 {
		if err := pgserver.SignalTree(pm, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("patroni: Freeze %s: %w", n.Name, err)
		}
		n.frozen = append(n.frozen, pm)
	}
	return nil
}

// Thaw resumes a frozen node: PostgreSQL first, then Patroni (which then
// finds out whether it still leads).
func (n *Node) Thaw() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.thawLocked()
	return nil
}

func (n *Node) thawLocked() {
	if n.frozen == nil {
		return
	}
	for _, pid := range n.frozen[1:] {
		_ = pgserver.SignalTree(pid, syscall.SIGCONT)
	}
	_ = syscall.Kill(n.frozen[0], syscall.SIGCONT)
	n.frozen = nil
}

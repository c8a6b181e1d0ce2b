package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvPgBouncer names the pgbouncer binary to run instead of the one on PATH
// (or /usr/sbin/pgbouncer, where Debian's package installs it).
const EnvPgBouncer = "PGLEASE_PGBOUNCER"

// BouncerOptions configure a PgBouncer.
type BouncerOptions struct {
	// PoolMode is "session" or "transaction" (pool_mode).
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user. Zero: 10.
	PoolSize int
}

// Bouncer is a real PgBouncer on loopback in front of a throwaway Server,
// run as a child process (as the server's unprivileged user when this
// process is root: PgBouncer refuses to run as root). Every database of the
// server is reachable through it, as the superuser, without a password.
type Bouncer struct {
	mode    string
	port    int
	root    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error // how the bouncer exited, once done is closed

	mu     sync.Mutex
	closed bool
}

// FindPgBouncer returns the pgbouncer binary ($PGLEASE_PGBOUNCER, then PATH,
// then /usr/sbin/pgbouncer) or an error saying what to install.
func FindPgBouncer() (string, error) {
	if p := os.Getenv(EnvPgBouncer); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("pgserver: %s=%s: %w", EnvPgBouncer, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("pgserver: pgbouncer not found (on PATH, /usr/sbin or $" + EnvPgBouncer +
		"): install Debian's PgBouncer with apt-get install pgbouncer (hack/install-deps.sh does)")
}

// StartBouncer starts a PgBouncer in front of s (a throwaway server) in
// opts.PoolMode and waits until it accepts connections.
func StartBouncer(ctx context.Context, s *Server, opts BouncerOptions) (*Bouncer, error) {
	if s.external {
		return nil, fmt.Errorf("pgserver: StartBouncer: %w", ErrNeedsThrowaway)
	}
	switch opts.PoolMode {
	case "session", "transaction":
	default:
		return nil, fmt.Errorf("pgserver: StartBouncer: pool mode %q, want session or transaction", opts.PoolMode)
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 10
	}
	bin, err := FindPgBouncer()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp(s.opts.Dir, "pglease-bouncer.")
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	b := &Bouncer{mode: opts.PoolMode, root: root, logPath: filepath.Join(root, "pgbouncer.log")}
	if s.cred != nil {
		if err := os.Chown(root, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = os.RemoveAll(root)
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	for attempt := 0; ; attempt++ {
		if b.port, err = freePort(); err != nil {
			break
		}
		if err = b.start(ctx, bin, s, opts); err == nil {
			return b, nil
		}
		if attempt == 4 || !strings.Contains(err.Error(), "in use") {
			break
		}
	}
	_ = os.RemoveAll(root)
	return nil, err
}

func (b *Bouncer) start(ctx context.Context, bin string, s *Server, opts BouncerOptions) error {
	users := filepath.Join(b.root, "userlist.txt")
	conf := filepath.Join(b.root, "pgbouncer.ini")
	var c strings.Builder
	fmt.Fprintf(&c, "[databases]\n* = host=127.0.0.1 port=%d\n\n[pgbouncer]\n", s.port)
	for _, kv := range [][2]string{
		{"listen_addr", "127.0.0.1"},
		{"listen_port", strconv.Itoa(b.port)},
		{"unix_socket_dir", ""},
		{"auth_type", "trust"},
		{"auth_file", users},
		{"admin_users", Superuser},
		{"pool_mode", opts.PoolMode},
		{"default_pool_size", strconv.Itoa(opts.PoolSize)},
		{"max_client_conn", "1000"},
		{"logfile", b.logPath},
		{"log_connections", "1"},
		{"log_disconnections", "1"},
	} {
		fmt.Fprintf(&c, "%s = %s\n", kv[0], kv[1])
	}
	for _, f := range []struct {
		path, text string
	}{{users, fmt.Sprintf("%q \"\"\n", Superuser)}, {conf, c.String()}} {
		if err := os.WriteFile(f.path, []byte(f.text), 0o644); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if s.cred != nil {
			if err := os.Chown(f.path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
		}
	}
	cmd := exec.Command(bin, conf)
	cmd.Dir = b.root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	// Pdeathsig fires when the thread that started the child ends, not the
	// process: start and wait on one locked thread, which lives as long as
	// the bouncer (it is killed with this process all the same).
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		b.waitErr = cmd.Wait() // reaps: never a zombie
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgserver: starting pgbouncer: %w", err)
	}
	b.cmd, b.done = cmd, done
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(b.logPath)
			return fmt.Errorf("pgserver: pgbouncer exited during startup: %s\n%s", out.String(), log)
		default:
		}
		if c, err := net.DialTimeout("tcp", b.Addr(), time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			_ = b.kill()
			return fmt.Errorf("pgserver: pgbouncer not listening on %s: %v\n%s", b.Addr(), ctx.Err(), out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// PoolMode is the bouncer's pool_mode.
func (b *Bouncer) PoolMode() string { return b.mode }

// Port is the bouncer's TCP port on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Addr is host:port of the bouncer.
func (b *Bouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// DSN returns dsn (a postgres:// URL of the server) pointing at the
// bouncer instead; query parameters are kept.
func (b *Bouncer) DSN(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("pgserver: Bouncer.DSN: a postgres:// URL is needed, got %q", dsn)
	}
	q := u.Query()
	q.Del("host")
	q.Del("port")
	u.RawQuery = q.Encode()
	u.Host = b.Addr()
	return u.String(), nil
}

// Log is what the bouncer logged so far, and how it exited if it did.
func (b *Bouncer) Log() string {
	data, _ := os.ReadFile(b.logPath)
	select {
	case <-b.done:
		return fmt.Sprintf("%s\n(pgbouncer exited: %v)", data, b.waitErr)
	default:
		return string(data)
	}
}

func (b *Bouncer) kill() error {
	if b.cmd == nil || b.cmd.Process == nil {
		return nil
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-b.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("pgserver: pgbouncer (pid %d) did not exit after SIGKILL", b.cmd.Process.Pid)
	}
}

// Close stops the bouncer and removes its directory. It is idempotent.
func (b *Bouncer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.kill()
	if rerr := os.RemoveAll(b.root); rerr != nil {
		err = errors.Join(err, fmt.Errorf("pgserver: %w", rerr))
	}
	return err
}

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the superuser role initdb creates in a throwaway server. It
// logs in without a password (trust) over TCP on 127.0.0.1 and over the
// server's private socket directory.
const Superuser = "postgres"

// ErrNeedsThrowaway is returned (wrapped, with the operation named) by the
// control methods of a server this process does not own: the external server
// of PGLEASE_TEST_DSN, or the per-binary shared server.
var ErrNeedsThrowaway = errors.New("pgserver: needs a throwaway server of its own")

// Options configure a throwaway server. The zero value is ready to use.
type Options struct {
	// BinDir is the directory holding initdb and postgres. Empty: FindBinDir.
	BinDir string

	// Settings are written to postgresql.conf after the harness's defaults
	// (shared_buffers=32MB, dynamic_shared_memory_type=mmap, timezone=UTC,
	// ...), so they override them: max_connections, fsync,
	// synchronous_commit, wal_writer_delay, and so on. Values are quoted by
	// the harness. port, listen_addresses and unix_socket_directories belong
	// to the harness and are refused.
	Settings map[string]string

	// FakeClock runs the server under libfaketime so that SetClockOffset can
	// move the wall clock the server sees (now(), clock_timestamp()).
	// Monotonic clocks (timeouts, sleeps) stay real.
	FakeClock bool

	// Dir is where the server's temporary directory is created.
	// Empty: os.TempDir().
	Dir string

	// StartTimeout bounds each start (initdb excluded) until the server
	// accepts connections, crash recovery included. Zero: 2 minutes.
	StartTimeout time.Duration
}

// ownedSettings are set on the postmaster's command line by the harness.
var ownedSettings = map[string]bool{"port": true, "listen_addresses": true, "unix_socket_directories": true}

var settingNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

func (o *Options) validate() error {
	for k, v := range o.Settings {
		if !settingNameRE.MatchString(k) {
			return fmt.Errorf("pgserver: Options.Settings: invalid setting name %q", k)
		}
		if ownedSettings[strings.ToLower(k)] {
			return fmt.Errorf("pgserver: Options.Settings: %s is set by the harness and cannot be overridden", k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return fmt.Errorf("pgserver: Options.Settings[%q]: value contains a line break or NUL", k)
		}
	}
	if o.StartTimeout < 0 {
		return fmt.Errorf("pgserver: Options.StartTimeout: negative (%v)", o.StartTimeout)
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 2 * time.Minute
	}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	return nil
}

// defaultSettings are written to postgresql.conf before Options.Settings.
var defaultSettings = [][2]string{
	{"shared_buffers", "32MB"},
	// Dynamic shared memory as files in the data directory: after a SIGKILL
	// nothing is left in /dev/shm; Close removes them with the directory.
	{"dynamic_shared_memory_type", "mmap"},
	{"timezone", "UTC"},
	{"log_timezone", "UTC"},
	{"log_line_prefix", "%m [%p] %q%u@%d "},
	{"logging_collector", "off"},
}

// Server is a PostgreSQL server for tests: a throwaway cluster this process
// started (and controls), or an external one (PGLEASE_TEST_DSN) on which it
// may only create databases. Methods are safe for concurrent use.
type Server struct {
	mu sync.Mutex

	opts    Options
	binDir  string
	version string
	major   int
	cred    *syscall.Credential

	root, dataDir, sockDir, logPath, clockFile string
	libFaketime                                string
	port                                       int

	cmd       *exec.Cmd
	done      chan struct{} // closed when the postmaster has been reaped
	waitErr   error
	frozen    bool
	closed    bool
	shm       shmSeg // of the last postmaster that started
	logOffset int64  // size of the log when the current postmaster started

	primaryPort     int    // a standby's primary
	primaryConninfo string // a standby's primary_conninfo as pg_basebackup -R wrote it
	standbyName     string

	external    bool
	shared      bool
	externalDSN string
	user        string
	created     []string // databases created on an external server
	dbSeq       int
}

// Start creates a throwaway cluster in a new temporary directory (initdb,
// as an unprivileged user when this process is root), starts it listening
// on 127.0.0.1 at a free port and on a private socket directory, and waits
// until it accepts connections. Close it when done, even on failure paths.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if _, done := swept.LoadOrStore(opts.Dir, struct{}{}); !done {
		sweepStale(opts.Dir)
	}

	s := &Server{opts: opts, shm: shmSeg{id: -1}, user: Superuser}
	var err error
	if s.binDir = opts.BinDir; s.binDir == "" {
		if s.binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if err := hasServerBinaries(s.binDir); err != nil {
		return nil, fmt.Errorf("pgserver: Options.BinDir: %w", err)
	}
	if s.cred, err = unprivilegedCredential(); err != nil {
		return nil, err
	}
	if s.version, s.major, err = serverVersion(ctx, s.binDir, s.cred); err != nil {
		return nil, err
	}
	if opts.FakeClock {
		if s.libFaketime, err = FindLibFaketime(); err != nil {
			return nil, err
		}
	}
	if err := s.create(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) create(ctx context.Context) error {
	if err := s.makeRoot(); err != nil {
		return err
	}
	if err := s.initdb(ctx); err != nil {
		return err
	}
	if err := s.writeConf(); err != nil {
		return err
	}
	return s.firstStart(ctx)
}

// makeRoot creates the server's temporary directory, its owner stamp, the
// socket directory and (FakeClock) the clock file.
func (s *Server) makeRoot() error {
	root, err := os.MkdirTemp(s.opts.Dir, dirPrefix)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	s.root = root
	if err := os.WriteFile(filepath.Join(root, ownerFile), []byte(ownerStamp()), 0o644); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	s.dataDir = filepath.Join(root, "data")
	s.sockDir = filepath.Join(root, "sock")
	s.logPath = filepath.Join(root, "postgres.log")
	s.clockFile = filepath.Join(root, "faketime")
	if err := os.Mkdir(s.sockDir, 0o700); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if s.cred != nil {
		for _, p := range []string{root, s.sockDir} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
		}
	}
	if s.opts.FakeClock {
		if err := s.writeClock("+0"); err != nil {
			return err
		}
	}
	return nil
}

// firstStart picks a free port and starts the postmaster on it.
func (s *Server) firstStart(ctx context.Context) error {
	// A free port can be taken between choosing it and the bind: retry.
	for attempt := 0; ; attempt++ {
		var err error
		if s.port, err = freePort(); err != nil {
			return err
		}
		err = s.startLocked(ctx)
		if err == nil || attempt == 4 || !strings.Contains(err.Error(), "could not bind") {
			return err
		}
	}
}

// runTool runs one of the installation's programs (initdb, pg_basebackup)
// in the server's root, as the server's user, in its own process group
// (killed with this process), and returns what it printed.
func (s *Server) runTool(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.Dir = s.root
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (s *Server) initdb(ctx context.Context) error {
	args := []string{"-D", s.dataDir, "-E", "UTF8", "--locale=C", "-U", Superuser, "-A", "trust", "--no-sync"}
	if s.major >= 13 {
		args = append(args, "--no-instructions")
	}
	if out, err := s.runTool(ctx, "initdb", args...); err != nil {
		hint := ""
		if s.cred != nil {
			hint = fmt.Sprintf("\n(initdb runs as uid %d because this process is root: every directory above %s must be searchable by that user)",
				s.cred.Uid, s.root)
		}
		return fmt.Errorf("pgserver: initdb: %v:\n%s%s", err, out, hint)
	}
	return nil
}

func (s *Server) writeConf() error {
	var b strings.Builder
	b.WriteString("\n# pgtest\n")
	for _, kv := range defaultSettings {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], quoteSetting(kv[1]))
	}
	writeSettings(&b, s.opts.Settings)
	if err := s.appendConf(b.String()); err != nil {
		return fmt.Errorf("pgserver: writing postgresql.conf: %w", err)
	}
	return nil
}

// writeSettings writes settings to b, a line each, sorted by name.
func writeSettings(b *strings.Builder, settings map[string]string) {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "%s = %s\n", k, quoteSetting(settings[k]))
	}
}

// appendConf appends text to the data directory's postgresql.conf.
func (s *Server) appendConf(text string) error {
	f, err := os.OpenFile(filepath.Join(s.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func quoteSetting(v string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", "''") + "'"
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: choosing a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startLocked launches the postmaster on the existing data directory and
// waits until it accepts connections.
func (s *Server) startLocked(ctx context.Context) error {
	if s.cmd != nil {
		return errors.New("pgserver: Start: the server is already running")
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer logf.Close()
	if fi, err := logf.Stat(); err == nil {
		s.logOffset = fi.Size()
	}
	cmd := exec.Command(filepath.Join(s.binDir, "postgres"),
		"-D", s.dataDir,
		"-p", strconv.Itoa(s.port),
		"-h", "127.0.0.1",
		"-k", s.sockDir)
	cmd.Dir = s.root
	cmd.Env = os.Environ()
	if s.opts.FakeClock {
		preload := s.libFaketime
		if old := os.Getenv("LD_PRELOAD"); old != "" {
			preload += ":" + old
		}
		cmd.Env = append(cmd.Env,
			"LD_PRELOAD="+preload,
			"FAKETIME_TIMESTAMP_FILE="+s.clockFile,
			"FAKETIME_NO_CACHE=1",
			"FAKETIME_DONT_FAKE_MONOTONIC=1")
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group; killed by the kernel if this process dies; run as
	// the unprivileged user when root.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: starting postgres: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.frozen = cmd, done, false
	go func() {
		err := cmd.Wait() // reaps: a killed postmaster never stays a zombie
		s.waitErr = err
		close(done)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = s.killLocked()
		return err
	}
	if pf, ok := readPidFile(s.dataDir); ok {
		s.shm = pf.shm
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.StartTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(s.dsn("postgres"))
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 2 * time.Second
	var lastErr error
	for {
		select {
		case <-s.done:
			return fmt.Errorf("pgserver: postgres exited during startup (%v); log:\n%s", s.waitErr, s.logTail())
		default:
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_ = conn.Close(context.Background())
			return nil
		}
		lastErr = err
		select {
		case <-s.done:
			return fmt.Errorf("pgserver: postgres exited during startup (%v); log:\n%s", s.waitErr, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("pgserver: postgres not ready: %v (last: %v); log:\n%s", ctx.Err(), lastErr, s.logTail())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// logTail returns the end of what the current postmaster has logged.
func (s *Server) logTail() string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 8 << 10
	off := s.logOffset
	if fi, err := f.Stat(); err == nil && fi.Size()-off > max {
		off = fi.Size() - max
	}
	_, _ = f.Seek(off, io.SeekStart)
	b, _ := io.ReadAll(f)
	return string(b)
}

// Log returns the whole server log (all starts).
func (s *Server) Log() string {
	if s.logPath == "" {
		return ""
	}
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func (s *Server) controllable(op string) error {
	switch {
	case s.external:
		return fmt.Errorf("%w: %s is impossible on the external server of %s; "+
			"use pgtest.New(t) or pgserver.Start for a server this test controls", ErrNeedsThrowaway, op, EnvTestDSN)
	case s.shared:
		return fmt.Errorf("%w: %s on the shared server would disturb every test using it; "+
			"use pgtest.New(t) or pgserver.Start for a server this test controls", ErrNeedsThrowaway, op)
	case s.closed:
		return fmt.Errorf("pgserver: %s: server is closed", op)
	}
	return nil
}

// control runs f with the server's lock held, after checking that op may
// be done to this server (the control methods' common first lines).
func (s *Server) control(op string, f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.controllable(op); err != nil {
		return err
	}
	return f()
}

// Kill crashes the server: SIGKILL to the postmaster and every backend and
// auxiliary process at once (nothing runs, nothing flushes after it), then
// reaps the postmaster. Committed data survive in the data directory; the
// next Start performs crash recovery. Killing a stopped server is a no-op.
func (s *Server) Kill() error {
	return s.control("Kill", s.killLocked)
}

func (s *Server) killLocked() error {
	if s.cmd == nil {
		return nil
	}
	var err error
	select {
	case <-s.done: // exited on its own and reaped: the pid may be reused
	default:
		err = killTree(s.cmd.Process.Pid)
	}
	<-s.done
	s.cmd, s.frozen = nil, false
	return err
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back, a shutdown checkpoint is written) and waits for it. A frozen server
// is thawed first. Stopping a stopped server is a no-op.
func (s *Server) Stop() error {
	return s.control("Stop", s.stopLocked)
}

func (s *Server) stopLocked() error {
	if s.cmd == nil {
		return nil
	}
	pid := s.cmd.Process.Pid
	if s.frozen {
		_ = signalTree(pid, syscall.SIGCONT)
		s.frozen = false
	}
	_ = syscall.Kill(pid, syscall.SIGINT)
	select {
	case <-s.done:
		s.cmd = nil
		return nil
	case <-time.After(time.Minute):
		err := s.killLocked()
		return errors.Join(errors.New("pgserver: Stop: fast shutdown took over a minute; killed"), err)
	}
}

// Start starts the server again on its data directory (same port, same
// socket directory), performing crash recovery if it was killed, and waits
// until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	return s.control("Start", func() error {
		return s.startLocked(ctx)
	})
}

// Restart is Stop then Start.
func (s *Server) Restart(ctx context.Context) error {
	return s.control("Restart", func() error {
		if err := s.stopLocked(); err != nil {
			return err
		}
		return s.startLocked(ctx)
	})
}

// Freeze stops every server process with SIGSTOP: connections stay open,
// queries and new connections hang until Thaw (or time out on the client).
func (s *Server) Freeze() error {
	return s.control("Freeze", func() error {
		if s.cmd == nil {
			return errors.New("pgserver: Freeze: the server is not running")
		}
		if s.frozen {
			return nil
		}
		if err := signalTree(s.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("pgserver: Freeze: %w", err)
		}
		s.frozen = true
		return nil
	})
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() error {
	return s.control("Thaw", func() error {
		if s.cmd == nil || !s.frozen {
			return nil
		}
		if err := signalTree(s.cmd.Process.Pid, syscall.SIGCONT); err != nil {
			return fmt.Errorf("pgserver: Thaw: %w", err)
		}
		s.frozen = false
		return nil
	})
}

// SetClockOffset sets the offset of the wall clock the server sees from the
// real one (Options.FakeClock): positive moves it into the future, negative
// into the past. It takes effect at once on the running server, in every
// backend, and survives restarts. Offsets do not accumulate: each call sets
// the offset from real time.
func (s *Server) SetClockOffset(d time.Duration) error {
	return s.control("SetClockOffset", func() error {
		if !s.opts.FakeClock {
			return errors.New("pgserver: SetClockOffset needs a server started with Options.FakeClock")
		}
		return s.writeClock(formatOffset(d))
	})
}

// formatOffset renders d in the relative format libfaketime reads from
// FAKETIME_TIMESTAMP_FILE: "+30", "-10.5" (seconds, fractions allowed).
func formatOffset(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	sec := d / time.Second
	frac := d % time.Second
	if frac == 0 {
		return fmt.Sprintf("%s%d", sign, sec)
	}
	return fmt.Sprintf("%s%d.%09d", sign, sec, frac)
}

// writeClock replaces the faketime file atomically (libfaketime re-reads it
// on every clock call and must never see it half-written).
func (s *Server) writeClock(spec string) error {
	tmp := s.clockFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec+"\n"), 0o644); err != nil {
		return fmt.Errorf("pgserver: writing clock offset: %w", err)
	}
	if err := os.Rename(tmp, s.clockFile); err != nil {
		return fmt.Errorf("pgserver: writing clock offset: %w", err)
	}
	return nil
}

// Close kills the server and removes everything it left: processes, the
// temporary directory and System V shared memory. It is idempotent. For an
// external server it drops the databases this Server created.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.external {
		return s.dropCreatedLocked()
	}
	var errs []error
	segs := []shmSeg{s.shm}
	if pf, ok := readPidFile(s.dataDir); ok && pf.shm != s.shm {
		segs = append(segs, pf.shm)
	}
	errs = append(errs, s.killLocked())
	for _, seg := range segs {
		errs = append(errs, removeShm(seg))
	}
	if s.root != "" {
		if err := os.RemoveAll(s.root); err != nil {
			errs = append(errs, fmt.Errorf("pgserver: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Accessors.

// BinDir is the directory of the server binaries.
func (s *Server) BinDir() string { return s.binDir }

// Version is the server's version line (`postgres --version`, or
// server_version for an external server).
func (s *Server) Version() string { return s.version }

// MajorVersion is the server's major version (15, 16, 17, ...).
func (s *Server) MajorVersion() int { return s.major }

// DataDir is the cluster's data directory ("" for an external server).
func (s *Server) DataDir() string { return s.dataDir }

// SocketDir is the private Unix-socket directory ("" for an external server).
func (s *Server) SocketDir() string { return s.sockDir }

// Port is the TCP port on 127.0.0.1 (0 for an external server).
func (s *Server) Port() int { return s.port }

// LogPath is the server's log file ("" for an external server).
func (s *Server) LogPath() string { return s.logPath }

// External reports whether this is the external server of PGLEASE_TEST_DSN.
func (s *Server) External() bool { return s.external }

// PID is the postmaster's pid, or 0 when the server is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the postmaster is running (frozen counts).
func (s *Server) Running() bool { return s.PID() != 0 }

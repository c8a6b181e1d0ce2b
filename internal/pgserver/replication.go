package pgserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming replication on loopback: a throwaway primary makes standbys of
// itself with pg_basebackup -R (the standby follows it over TCP on
// 127.0.0.1 with physical streaming replication, as its application_name
// says); a standby is promoted with pg_ctl promote or pg_promote(); the
// primary is killed with Kill or left running beside the promoted standby
// (split brain). Synchronous replication is a setting of the primary
// (SetSynchronousStandbyNames), made after the standbys exist so that they
// do not inherit it through the base backup.

// StandbyOptions configure a standby made by StartStandby.
type StandbyOptions struct {
	// Name is the standby's application_name, as the primary sees it in
	// pg_stat_replication and synchronous_standby_names. Empty:
	// "standby<N>" (N counts the standbys of this process).
	Name string
	// Settings are appended to the postgresql.conf the base backup copied
	// from the primary (so they override the primary's).
	Settings map[string]string
}

// StartStandby makes a standby of s: a base backup of the running primary
// (pg_basebackup -R -X stream -c fast, which writes standby.signal and
// primary_conninfo; without pg_basebackup in the installation, a copy of
// the cleanly stopped primary's data directory with the same two settings:
// the primary restarts once) into a new temporary directory, started on a free port
// and waited for until it accepts connections and streams from s. The
// standby is a Server of its own (Close it too); its control methods work
// as on any throwaway server.
func (s *Server) StartStandby(ctx context.Context, o StandbyOptions) (*Server, error) {
	s.mu.Lock()
	if err := s.controllable("StartStandby"); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if s.cmd == nil {
		s.mu.Unlock()
		return nil, errors.New("pgserver: StartStandby: the primary is not running")
	}
	opts := s.opts
	opts.Settings = maps.Clone(o.Settings)
	if err := opts.validate(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if o.Name == "" {
		o.Name = "standby" + strconv.FormatInt(standbySeq.Add(1), 10)
	}
	var err error
	st := &Server{opts: opts, shm: shmSeg{id: -1}, user: Superuser, binDir: s.binDir, version: s.version,
		major: s.major, cred: s.cred, libFaketime: s.libFaketime, primaryPort: s.port}
	primaryPort := s.port
	s.mu.Unlock()

	if err := st.makeRoot(); err != nil {
		_ = st.Close()
		return nil, err
	}
	if fileExists(filepath.Join(st.binDir, "pg_basebackup")) {
		err = st.baseBackup(ctx, primaryPort, o.Name)
	} else {
		err = s.coldCopy(ctx, st, o.Name)
	}
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	if err := st.appendSettings(o.Settings); err != nil {
		_ = st.Close()
		return nil, err
	}
	if err := st.firstStart(ctx); err != nil {
		_ = st.Close()
		return nil, err
	}
	st.standbyName = o.Name
	if err := s.WaitStreaming(ctx, o.Name); err != nil {
		_ = st.Close()
		return nil, err
	}
	return st, nil
}

func (st *Server) conninfo(name string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", st.primaryPort, Superuser, name)
}

var standbySeq atomic.Int64

func (st *Server) baseBackup(ctx context.Context, primaryPort int, name string) error {
	st.primaryPort = primaryPort
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	args := []string{"-D", st.dataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync", "-d", st.conninfo(name)}
	if out, err := st.runTool(ctx, "pg_basebackup", args...); err != nil {
		return fmt.Errorf("pgserver: pg_basebackup: %v:\n%s", err, out)
	}
	st.primaryConninfo = st.conninfo(name)
	return nil
}

// coldCopy makes st a standby of s without pg_basebackup (installations
// that ship only initdb, pg_ctl and postgres, like the npm-packaged servers
// of the version matrix): s is shut down cleanly, its data directory copied
// (cp -a), standby.signal and primary_conninfo written as pg_basebackup -R
// would, and s started again.
func (s *Server) coldCopy(ctx context.Context, st *Server, name string) error {
	st.primaryPort = s.port
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		return err
	}
	cp := exec.CommandContext(ctx, "cp", "-a", s.dataDir, st.dataDir)
	out, cerr := cp.CombinedOutput()
	serr := s.startLocked(ctx)
	if cerr != nil {
		return fmt.Errorf("pgserver: copying the primary's data directory: %v: %s", cerr, out)
	}
	if serr != nil {
		return serr
	}
	for _, f := range []string{"postmaster.pid", "postmaster.opts"} {
		_ = os.Remove(filepath.Join(st.dataDir, f))
	}
	st.primaryConninfo = st.conninfo(name)
	if err := os.WriteFile(filepath.Join(st.dataDir, "standby.signal"), nil, 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(st.dataDir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	_, err = fmt.Fprintf(f, "primary_conninfo = %s\n", quoteSetting(st.primaryConninfo))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && st.cred != nil {
		for _, p := range []string{filepath.Join(st.dataDir, "standby.signal"), filepath.Join(st.dataDir, "postgresql.auto.conf")} {
			if err = os.Chown(p, int(st.cred.Uid), int(st.cred.Gid)); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("pgserver: writing the standby's configuration: %w", err)
	}
	return nil
}

func (s *Server) appendSettings(settings map[string]string) error {
	if len(settings) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\n# pgserver standby\n")
	writeSettings(&b, settings)
	return s.appendConf(b.String())
}

// StandbyName is the application_name a standby streams under ("" for a
// server that is not a standby made by StartStandby).
func (s *Server) StandbyName() string { return s.standbyName }

// WaitStreaming waits until the primary s has a walsender for the standby
// named name in state streaming.
func (s *Server) WaitStreaming(ctx context.Context, name string) error {
	return s.poll(ctx, time.Minute, "standby "+name+" streaming", func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'", name).Scan(&n)
		return n > 0, err
	})
}

// poll runs check on a fresh connection to s every 10 ms until it reports
// true, fails, or d passes.
func (s *Server) poll(ctx context.Context, d time.Duration, what string, check func(*pgx.Conn) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	for {
		err := s.admin(ctx, func(c *pgx.Conn) error {
			ok, err := check(c)
			if err == nil && !ok {
				err = errors.New("not yet")
			}
			return err
		})
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: waiting for %s: %v (last: %v)", what, ctx.Err(), last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SetSynchronousStandbyNames sets synchronous_standby_names on s (ALTER
// SYSTEM, reload) and waits until new sessions see it. "" makes every
// standby asynchronous.
func (s *Server) SetSynchronousStandbyNames(ctx context.Context, v string) error {
	if err := s.alterSystem(ctx, "synchronous_standby_names", v); err != nil {
		return err
	}
	return s.poll(ctx, time.Minute, "synchronous_standby_names to be "+strconv.Quote(v), func(c *pgx.Conn) (bool, error) {
		var got string
		err := c.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&got)
		return got == v, err
	})
}

func (s *Server) alterSystem(ctx context.Context, name, value string) error {
	err := s.admin(ctx, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "ALTER SYSTEM SET "+pgx.Identifier{name}.Sanitize()+" = "+quoteSetting(value)); err != nil {
			return err
		}
		_, err := c.Exec(ctx, "SELECT pg_reload_conf()")
		return err
	})
	if err != nil {
		return fmt.Errorf("pgserver: ALTER SYSTEM SET %s: %w", name, err)
	}
	return nil
}

func (s *Server) setConninfo(ctx context.Context, v string) error {
	return s.alterSystem(ctx, "primary_conninfo", v)
}

// StopStreaming cuts the standby s off its primary (primary_conninfo
// emptied, reload) and waits until its WAL receiver is gone: from then on
// nothing the primary writes reaches s, so it is lost if s is promoted.
// The cut is from the standby's side, as if the network to it failed.
func (s *Server) StopStreaming(ctx context.Context) error {
	if s.primaryConninfo == "" {
		return errors.New("pgserver: StopStreaming: not a standby made by StartStandby")
	}
	if err := s.setConninfo(ctx, ""); err != nil {
		return err
	}
	return s.poll(ctx, time.Minute, "the WAL receiver to stop", func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
		return n == 0, err
	})
}

// ResumeStreaming undoes StopStreaming.
func (s *Server) ResumeStreaming(ctx context.Context) error {
	if s.primaryConninfo == "" {
		return errors.New("pgserver: ResumeStreaming: not a standby made by StartStandby")
	}
	return s.setConninfo(ctx, s.primaryConninfo)
}

// WaitReplayed waits until standby has replayed everything s (its primary)
// had written when WaitReplayed was called.
func (s *Server) WaitReplayed(ctx context.Context, standby *Server) error {
	var lsn string
	if err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	}); err != nil {
		return fmt.Errorf("pgserver: WaitReplayed: %w", err)
	}
	return standby.poll(ctx, time.Minute, "replay up to "+lsn, func(c *pgx.Conn) (bool, error) {
		var ok bool
		err := c.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&ok)
		return ok, err
	})
}

// Promote promotes the standby s with pg_ctl promote -w (it waits until s
// accepts writes).
func (s *Server) Promote(ctx context.Context) error {
	s.mu.Lock()
	if err := s.controllable("Promote"); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "pg_ctl"), "promote", "-D", s.dataDir, "-w", "-t", "60")
	cmd.Dir = s.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: pg_ctl promote: %v:\n%s", err, out)
	}
	return s.waitWritable(ctx)
}

// EndWithoutPromotion ends the standby s the way a hand-run disaster
// recovery step sometimes does instead of a promotion: a clean stop, its
// standby.signal removed, a start. It comes up as a primary on the same WAL
// timeline (recovery to the end of the WAL it has, no new timeline), and
// waits until it accepts writes.
func (s *Server) EndWithoutPromotion(ctx context.Context) error {
	err := s.control("EndWithoutPromotion", func() error {
		if err := s.stopLocked(); err != nil {
			return err
		}
		if err := os.Remove(filepath.Join(s.dataDir, "standby.signal")); err != nil {
			return fmt.Errorf("pgserver: EndWithoutPromotion: %w", err)
		}
		return s.startLocked(ctx)
	})
	if err != nil {
		return err
	}
	return s.waitWritable(ctx)
}

// PromoteSQL promotes the standby s with SELECT pg_promote(true, 60).
func (s *Server) PromoteSQL(ctx context.Context) error {
	var ok bool
	if err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok)
	}); err != nil {
		return fmt.Errorf("pgserver: pg_promote: %w", err)
	}
	if !ok {
		return errors.New("pgserver: pg_promote: not promoted within 60 s")
	}
	return s.waitWritable(ctx)
}

func (s *Server) waitWritable(ctx context.Context) error {
	return s.poll(ctx, time.Minute, "the promoted server to accept writes", func(c *pgx.Conn) (bool, error) {
		var rec bool
		err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec)
		return !rec, err
	})
}

// InRecovery reports whether s is a standby (pg_is_in_recovery()).
func (s *Server) InRecovery(ctx context.Context) (bool, error) {
	var rec bool
	err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec)
	})
	return rec, err
}

// Timeline is the WAL timeline a primary writes on (from the WAL file name
// of its current LSN, as pg_lease 0.3.0 reads it). On a standby it fails
// (55000, recovery is in progress).
func (s *Server) Timeline(ctx context.Context) (int64, error) {
	var tl int64
	err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tl)
	})
	return tl, err
}

// MultiHostDSN is a keyword/value DSN for database db listing the servers in
// order with target_session_attrs=read-write: a client tries them in turn
// and keeps the first that accepts writes (the primary, whichever it is).
func MultiHostDSN(db string, servers ...*Server) string {
	hosts, ports := "", ""
	for i, s := range servers {
		if i > 0 {
			hosts, ports = hosts+",", ports+","
		}
		hosts += "127.0.0.1"
		ports += strconv.Itoa(s.Port())
	}
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2",
		hosts, ports, Superuser, quoteKeyword(db))
}

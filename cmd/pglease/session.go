package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// The connection every command uses: its settings, the trust check and the
// session (a connection re-opened after it is lost).

// config parses the connection settings (no network).
func (a *app) config() (*pgx.ConnConfig, error) {
	if a.cfg != nil {
		return a.cfg, nil
	}
	dsn, source := a.dsn, "--dsn"
	switch {
	case dsn != "":
	case a.dsnFile != "" || a.getenv("PGLEASE_DSN_FILE") != "":
		path := a.dsnFile
		source = "--dsn-file " + path
		if path == "" {
			path = a.getenv("PGLEASE_DSN_FILE")
			source = "$PGLEASE_DSN_FILE (" + path + ")"
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, usagef("reading the connection string: %v", err)
		}
		dsn = strings.TrimSpace(string(b))
	case a.getenv("PGLEASE_DSN") != "":
		dsn, source = a.getenv("PGLEASE_DSN"), "$PGLEASE_DSN"
	default:
		source = "the PG* environment variables"
	}
	a.dsnSource = source
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("invalid connection string from %s: %s", source, parseErrorText(dsn, err))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	// A change whose wait for the synchronous standbys was cancelled is
	// reported as unknown, never as done (lease.ErrCommitUnknown).
	lease.ObserveCommits(&cfg.Config)
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "pglease"
	}
	a.cfg, a.password = cfg, cfg.Password
	return cfg, nil
}

// connect opens a connection with the invocation's settings.
func (a *app) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := a.config()
	if err != nil {
		return nil, err
	}
	a.logf("connecting to host=%s port=%d dbname=%s user=%s (from %s)", cfg.Host, cfg.Port, cfg.Database, cfg.User, a.dsnSource)
	conn, err := a.connectFn(ctx, cfg.Copy())
	if err != nil {
		return nil, &connectError{err: err}
	}
	if err := a.refuseUntrusted(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// refuseUntrusted: a superuser calls nothing in schema lease unless it can
// trust the install (leaseadmin.Describe): a function another role owns
// would run with the superuser's privileges. install and version read the
// install themselves and call nothing untrusted.
func (a *app) refuseUntrusted(ctx context.Context, conn *pgx.Conn) error {
	if a.op == "install" || a.op == "version" || conn.PgConn().ParameterStatus("is_superuser") != "on" {
		return nil
	}
	in, err := leaseadmin.Describe(ctx, conn)
	if errors.Is(err, lease.ErrNotInstalled) {
		return nil
	}
	if err != nil {
		return err
	}
	return in.TrustError()
}

// withConn runs f on a new connection, closed afterwards.
func (a *app) withConn(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

// session is a connection that is re-opened after it is lost. It is a
// lease.Querier, so one lease.Client serves across reconnections. Calls are
// serialized: a pgx.Conn runs one query at a time.
type session struct {
	a    *app
	mu   sync.Mutex
	conn *pgx.Conn
}

func (s *session) get(ctx context.Context) (*pgx.Conn, error) {
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	s.drop()
	c, err := s.a.connect(ctx)
	if err != nil {
		return nil, err
	}
	s.conn = c
	return c, nil
}

func (s *session) drop() {
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.conn.Close(ctx)
		cancel()
		s.conn = nil
	}
}

// close drops the connection once no call is in flight.
func (s *session) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop()
}

// done drops the connection when err says it was lost.
func (s *session) done(conn *pgx.Conn, err error) {
	if err != nil && connLost(conn, err) && s.conn == conn {
		s.drop()
	}
}

// lost says whether err, returned by a call through s, lost the connection.
func (s *session) lost(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connLost(s.conn, err)
}

func (s *session) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, err := s.get(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := conn.Exec(ctx, sql, args...)
	s.done(conn, err)
	return tag, err
}

// LendConn lends lease.Client the session's connection for one call, so
// that the Client sees the call's commit warnings (lease.ConnLender): a grant
// or release whose wait for the synchronous standbys was cancelled is then
// lease.ErrCommitUnknown, never success.
func (s *session) LendConn(ctx context.Context) (lease.Querier, *pgconn.PgConn, func(), error) {
	s.mu.Lock()
	conn, err := s.get(ctx)
	if err != nil {
		s.mu.Unlock()
		return nil, nil, nil, err
	}
	return lentConn{s: s, conn: conn}, conn.PgConn(), s.mu.Unlock, nil
}

var _ lease.ConnLender = (*session)(nil)

// lentConn runs calls on the lent connection (the session is locked
// meanwhile) and drops it when a call says it was lost.
type lentConn struct {
	s    *session
	conn *pgx.Conn
}

func (l lentConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := l.conn.Exec(ctx, sql, args...)
	l.s.done(l.conn, err)
	return tag, err
}

func (l lentConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := l.conn.Query(ctx, sql, args...)
	if err != nil {
		l.s.done(l.conn, err)
	}
	return rows, err
}

func (l lentConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return lentRow{row: l.conn.QueryRow(ctx, sql, args...), l: l}
}

type lentRow struct {
	row pgx.Row
	l   lentConn
}

func (r lentRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.l.s.done(r.l.conn, err)
	return err
}

func (s *session) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s.mu.Lock()
	conn, err := s.get(ctx)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		s.done(conn, err)
		s.mu.Unlock()
		return nil, err
	}
	return &sessionRows{Rows: rows, s: s, conn: conn}, nil
}

func (s *session) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	s.mu.Lock()
	conn, err := s.get(ctx)
	if err != nil {
		s.mu.Unlock()
		return errRow{err}
	}
	return &sessionRow{row: conn.QueryRow(ctx, sql, args...), s: s, conn: conn}
}

// sessionRows holds the session until the rows are closed.
type sessionRows struct {
	pgx.Rows
	s      *session
	conn   *pgx.Conn
	closed bool
}

func (r *sessionRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		r.s.done(r.conn, r.Rows.Err())
		r.s.mu.Unlock()
	}
}

// sessionRow holds the session until it is scanned.
type sessionRow struct {
	row  pgx.Row
	s    *session
	conn *pgx.Conn
}

func (r *sessionRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.s.done(r.conn, err)
	r.s.mu.Unlock()
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// connLost says whether err ended the connection (rather than being a
// server's answer on a working one).
func connLost(conn *pgx.Conn, err error) bool {
	var ce *connectError
	code := sqlState(err)
	return conn == nil || conn.IsClosed() || errors.As(err, &ce) ||
		strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || (code == "" && pgconn.SafeToRetry(err))
}

func connLostReason(err error) string {
	var ce *connectError
	if errors.As(err, &ce) {
		return connectReason(ce.err)
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Severity + ": " + pg.Message + " (SQLSTATE " + pg.Code + ")"
	}
	return oneLine(err.Error())
}

package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvTestDSN names the variable holding the DSN of an external server
// (superuser or CREATEDB role) that Shared, NewDatabase and Main use instead
// of starting a throwaway server. Each test still gets a database of its own.
const EnvTestDSN = "PGLEASE_TEST_DSN"

// External returns a Server for an existing PostgreSQL server at dsn. It can
// create and drop databases and roles but not be controlled: Kill, Stop,
// Freeze and the like return an error wrapping ErrNeedsThrowaway. Close drops
// the databases it created.
func External(ctx context.Context, dsn string) (*Server, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("pgserver: connecting to the external server (%s): %w", EnvTestDSN, err)
	}
	defer conn.Close(context.Background())
	s := &Server{external: true, externalDSN: dsn}
	var num string
	if err := conn.QueryRow(ctx, "SELECT current_user, current_setting('server_version'), current_setting('server_version_num')").
		Scan(&s.user, &s.version, &num); err != nil {
		return nil, fmt.Errorf("pgserver: external server: %w", err)
	}
	if n, err := strconv.Atoi(num); err == nil {
		s.major = n / 10000
	}
	return s, nil
}

// User is the role the DSNs log in as (Superuser for a throwaway server).
func (s *Server) User() string { return s.user }

// DSN is a postgres:// URL of the server's administrative database
// ("postgres" for a throwaway server; PGLEASE_TEST_DSN itself when external).
func (s *Server) DSN() string {
	if s.external {
		return s.externalDSN
	}
	return s.dsn("postgres")
}

// DatabaseDSN is a DSN for database name on this server, as Superuser (or
// the external DSN's user). It does not create the database.
func (s *Server) DatabaseDSN(name string) string {
	if s.external {
		return withDatabase(s.externalDSN, name)
	}
	return s.dsn(name)
}

// SocketDSN is a DSN for database name through the private Unix socket
// (throwaway servers only; "" when external).
func (s *Server) SocketDSN(name string) string {
	if s.external {
		return ""
	}
	return fmt.Sprintf("postgres://%s@/%s?host=%s&port=%d&sslmode=disable",
		Superuser, url.PathEscape(name), url.QueryEscape(s.sockDir), s.port)
}

func (s *Server) dsn(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, s.port, url.PathEscape(db))
}

// withDatabase returns dsn (URL or keyword/value form) naming database db.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path, u.RawPath = "/"+db, ""
			return u.String()
		}
	}
	return dsn + " dbname=" + quoteKeyword(db) // the last keyword wins
}

func quoteKeyword(v string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", `\'`) + "'"
}

// WithUser returns dsn (URL or keyword/value form) logging in as user
// instead (no password: throwaway servers trust every local login).
func WithUser(dsn, user string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.User = url.User(user)
			return u.String()
		}
	}
	return dsn + " user=" + quoteKeyword(user) + " password=''"
}

// admin runs f on a connection to the administrative database.
func (s *Server) admin(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return fmt.Errorf("pgserver: connecting to %s: %w", s.redacted(), err)
	}
	defer conn.Close(context.Background())
	return f(conn)
}

func (s *Server) redacted() string {
	if !s.external {
		return s.DSN()
	}
	if cfg, err := pgx.ParseConfig(s.externalDSN); err == nil {
		return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	}
	return EnvTestDSN
}

// CreateDatabase creates database name (from template0) and returns its
// DSN.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if name == "" {
		return "", errors.New("pgserver: CreateDatabase: empty name")
	}
	err := s.admin(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0")
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pgserver: CreateDatabase %q: %w", name, err)
	}
	if s.external {
		s.mu.Lock()
		s.created = append(s.created, name)
		s.mu.Unlock()
	}
	return s.DatabaseDSN(name), nil
}

// NewDatabase creates a database with a fresh name (unique across processes
// sharing the server) and returns its DSN.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	_, dsn, err := s.newDatabase(ctx)
	return dsn, err
}

func (s *Server) newDatabase(ctx context.Context) (name, dsn string, err error) {
	s.mu.Lock()
	s.dbSeq++
	seq := s.dbSeq
	s.mu.Unlock()
	var r [4]byte
	_, _ = rand.Read(r[:])
	name = fmt.Sprintf("pgtest_%d_%d_%s", os.Getpid(), seq, hex.EncodeToString(r[:]))
	dsn, err = s.CreateDatabase(ctx, name)
	return name, dsn, err
}

// DropDatabase drops database name if it exists, terminating its sessions
// first (PostgreSQL 13 and later).
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	sql := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
	if s.major >= 13 {
		sql += " WITH (FORCE)"
	}
	err := s.admin(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, sql)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgserver: DropDatabase %q: %w", name, err)
	}
	s.mu.Lock()
	for i, n := range s.created {
		if n == name {
			s.created = append(s.created[:i], s.created[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) dropCreatedLocked() error {
	names := s.created
	s.created = nil
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	s.mu.Unlock() // DropDatabase takes the lock
	for _, n := range names {
		errs = append(errs, s.DropDatabase(ctx, n))
	}
	s.mu.Lock()
	return errors.Join(errs...)
}

// CreateRole creates role name with the given attributes (SQL, for example
// "LOGIN NOSUPERUSER" or "LOGIN CREATEDB"), or alters an existing role to
// have them. Roles belong to the whole cluster: on a shared or external
// server, give them names unique to the test.
func (s *Server) CreateRole(ctx context.Context, name, attributes string) error {
	if name == "" {
		return errors.New("pgserver: CreateRole: empty name")
	}
	id := pgx.Identifier{name}.Sanitize()
	return s.admin(ctx, func(c *pgx.Conn) error {
		var exists bool
		if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists); err != nil {
			return fmt.Errorf("pgserver: CreateRole %q: %w", name, err)
		}
		sql := "CREATE ROLE " + id + " " + attributes
		if exists {
			if strings.TrimSpace(attributes) == "" {
				return nil
			}
			sql = "ALTER ROLE " + id + " " + attributes
		}
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgserver: CreateRole %q: %w", name, err)
		}
		return nil
	})
}

package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

// Mode says how pg_lease is installed in a database.
type Mode int

const (
	// ModeNone: not installed (Installed returns it with ErrNotInstalled).
	ModeNone Mode = iota
	// ModeExtension: CREATE EXTENSION pg_lease (InstallExtension).
	ModeExtension
	// ModeSchema: the same SQL run as a plain schema, for hosts that forbid
	// custom extensions (InstallSchema).
	ModeSchema
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeExtension:
		return "extension"
	case ModeSchema:
		return "schema"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Version is the pg_lease version this module speaks and installs.
const Version = pgleasesql.Version

// Beginner starts transactions: what the install functions and pkg/fence's
// guards need. *pgxpool.Pool, *pgx.Conn and pgx.Tx (where Begin opens a
// savepoint) all satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Installed reports which pg_lease version is installed in the database q is
// connected to, and how. With neither the extension nor a schema-only
// install present it returns ModeNone and an error matching ErrNotInstalled.
func Installed(ctx context.Context, q Querier) (version string, mode Mode, err error) {
	var (
		extVersion *string
		hasVersion bool
		hasSchema  bool
	)
	err = q.QueryRow(ctx, `SELECT
		  (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_lease'),
		  pg_catalog.to_regprocedure('lease.version()') IS NOT NULL,
		  EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n WHERE n.nspname = 'lease')`).
		Scan(&extVersion, &hasVersion, &hasSchema)
	if err != nil {
		return "", ModeNone, fmt.Errorf("lease: reading the installed version: %w", err)
	}
	switch {
	case extVersion != nil:
		return *extVersion, ModeExtension, nil
	case !hasVersion && hasSchema:
		return "", ModeNone, fmt.Errorf("%w: a schema named lease exists but has no lease.version(): it is not pg_lease's", ErrNotInstalled)
	case !hasVersion:
		return "", ModeNone, ErrNotInstalled
	}
	if err := q.QueryRow(ctx, `SELECT lease.version()`).Scan(&version); err != nil {
		return "", ModeNone, fmt.Errorf("lease: reading the installed version: %w", err)
	}
	return version, ModeSchema, nil
}

// InstallExtension makes sure the pg_lease extension is installed, at
// Version, in the database db is connected to, in one transaction (a
// savepoint when db is a pgx.Tx): CREATE EXTENSION pg_lease VERSION Version
// when it is absent, ALTER EXTENSION pg_lease UPDATE TO Version when an older
// version is installed. The server must have the extension's files (make -C
// sql install) and the role the privilege to create it.
//
// It is a no-op when the extension is already installed at Version. It
// returns an error matching ErrVersionMismatch when the installed extension
// is newer than, or has no update path to, Version (nothing is then
// changed), and ErrModeMismatch when pg_lease was installed as a plain schema
// (InstallSchema). Concurrent installers are safe: the loser of the race
// finds the winner's install and checks it.
func InstallExtension(ctx context.Context, db Beginner) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		v, mode, err := Installed(ctx, tx)
		switch {
		case err == nil && mode == ModeSchema:
			return fmt.Errorf("lease: InstallExtension: %w: pg_lease %s is installed as a plain schema (InstallSchema); drop schema lease first to convert",
				ErrModeMismatch, v)
		case err == nil && v == Version:
			return nil
		case err == nil:
			if _, uerr := pgleasesql.UpdateScripts(v); uerr != nil {
				return checkVersion("InstallExtension", v, mode)
			}
			if _, err := tx.Exec(ctx, `ALTER EXTENSION pg_lease UPDATE TO `+quoteLiteral(Version)); err != nil {
				return fmt.Errorf("lease: InstallExtension: updating pg_lease %s to %s: %w", v, Version, err)
			}
		case !errors.Is(err, ErrNotInstalled):
			return err
		default:
			if _, err := tx.Exec(ctx, `CREATE EXTENSION pg_lease VERSION `+quoteLiteral(Version)); err != nil {
				return fmt.Errorf("lease: InstallExtension: %w", err)
			}
		}
		v, mode, err = Installed(ctx, tx)
		if err != nil {
			return fmt.Errorf("lease: InstallExtension: after CREATE EXTENSION: %w", err)
		}
		return checkVersion("InstallExtension", v, mode)
	})
}

// InstallSchema installs pg_lease without CREATE EXTENSION, for managed
// PostgreSQL that forbids custom extensions: it runs this module's own SQL
// (the base install script and the update scripts up to Version, the same
// files CREATE EXTENSION runs) as plain SQL, with the extension-only lines
// removed and @extowner@ replaced by the current role, in one transaction (a
// savepoint when db is a pgx.Tx). The role needs CREATE on the database; the
// objects belong to it.
//
// The result is the same schema, functions and privileges as the extension;
// lease.version() records the version, and the schema's comment says it is a
// schema-only install. A second call with the same version is a no-op, as is
// a call where the extension is installed at Version; a schema-only install
// of an older version is updated with the update scripts. It returns an error
// matching ErrVersionMismatch when a newer or unknown version is installed,
// or the extension at another version. Concurrent installers are safe.
func InstallSchema(ctx context.Context, db Beginner) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		v, mode, err := Installed(ctx, tx)
		var from string
		switch {
		case err == nil && (v == Version || mode == ModeExtension):
			return checkVersion("InstallSchema", v, mode)
		case err == nil:
			from = v
		case !errors.Is(err, ErrNotInstalled):
			return err
		}
		var role string
		if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
			return fmt.Errorf("lease: InstallSchema: %w", err)
		}
		script, err := schemaScript(role, from)
		if err != nil {
			if from != "" {
				return checkVersion("InstallSchema", v, mode)
			}
			return err
		}
		if _, err := tx.Exec(ctx, script); err != nil {
			return fmt.Errorf("lease: InstallSchema: running the install script: %w", err)
		}
		v, mode, err = Installed(ctx, tx)
		if err != nil {
			return fmt.Errorf("lease: InstallSchema: after the install script: %w", err)
		}
		return checkVersion("InstallSchema", v, mode)
	})
}

// SchemaScript is the SQL that InstallSchema runs on a database without
// pg_lease, with owner (a role name, quoted here) as the owner of every
// object: the base install script and every update script up to Version,
// without their "\echo ... \quit" guards, followed by a COMMENT that marks
// the schema-only install.
func SchemaScript(owner string) (string, error) { return schemaScript(owner, "") }

// schemaScript is SchemaScript from version from ("" for a fresh install).
func schemaScript(owner, from string) (string, error) {
	if owner == "" {
		return "", fmt.Errorf("lease: SchemaScript: %w: empty owner", ErrInvalidInput)
	}
	var srcs []string
	if from == "" {
		srcs = append(srcs, pgleasesql.InstallScript())
		from = pgleasesql.BaseVersion
	}
	updates, err := pgleasesql.UpdateScripts(from)
	if err != nil {
		return "", fmt.Errorf("lease: SchemaScript: %w", err)
	}
	srcs = append(srcs, updates...)
	var b strings.Builder
	for _, src := range srcs {
		for _, l := range strings.SplitAfter(src, "\n") {
			t := strings.TrimSpace(l)
			if strings.HasPrefix(t, `\echo`) {
				continue // the guard against running the script outside CREATE/ALTER EXTENSION
			}
			if strings.HasPrefix(t, `\`) {
				return "", fmt.Errorf("lease: SchemaScript: unexpected psql meta-command in the SQL: %q", t)
			}
			b.WriteString(l)
		}
		b.WriteString("\n")
	}
	out := strings.ReplaceAll(b.String(), "@extowner@", pgx.Identifier{owner}.Sanitize())
	if i := strings.Index(out, "@ext"); i >= 0 {
		end := min(len(out), i+24)
		return "", fmt.Errorf("lease: SchemaScript: unhandled extension placeholder near %q", out[i:end])
	}
	out += fmt.Sprintf("\nCOMMENT ON SCHEMA lease IS %s;\n",
		quoteLiteral("pg_lease "+Version+": time-bounded leases with fencing epochs (schema-only install, without CREATE EXTENSION)"))
	return out, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func checkVersion(op, v string, mode Mode) error {
	if v != Version {
		return fmt.Errorf("lease: %s: %w: pg_lease %s is installed (%s), this module speaks %s",
			op, ErrVersionMismatch, v, mode, Version)
	}
	return nil
}

// inTx runs f in a transaction of db and commits when f returns nil. Two
// installers racing in one database both try to create schema lease (or the
// extension); the loser waits for the winner's commit and then fails on a
// catalog unique index. inTx then rolls back and runs f once more, which
// finds the winner's install. (No advisory lock: pg_lease uses none.)
func inTx(ctx context.Context, db Beginner, f func(pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := inTxOnce(ctx, db, f)
		var pg *pgconn.PgError
		if attempt < 2 && errors.As(err, &pg) && (pg.Code == "23505" || pg.Code == "42P06" || pg.Code == "42710") {
			continue // unique_violation, duplicate_schema, duplicate_object: lost an install race
		}
		return err
	}
}

func inTxOnce(ctx context.Context, db Beginner, f func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("lease: install: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("lease: install: commit: %w", err)
	}
	return nil
}

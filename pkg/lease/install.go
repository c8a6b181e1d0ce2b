package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

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

// Beginner is what the install functions need: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx (where Begin opens a savepoint) all satisfy it.
type Beginner interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// installLockKey is the transaction-level advisory lock key that serializes
// concurrent installs in one database (the 64-bit value of "pg_lease").
const installLockKey = 0x70675f6c65617365

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
// Version, in the database db is connected to: in one transaction (a
// savepoint when db is a pgx.Tx), under an advisory lock that serializes
// concurrent installers, CREATE EXTENSION IF NOT EXISTS pg_lease, then a
// version check. The server must have the extension's files (make -C sql
// install) and the role the privilege to create it.
//
// It is a no-op when the extension is already installed at Version. It
// returns an error matching ErrVersionMismatch when the installed extension,
// or the server's default version that it would install, differs from
// Version (nothing is then created), and ErrModeMismatch when pg_lease was
// installed as a plain schema (InstallSchema).
func InstallExtension(ctx context.Context, db Beginner) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		v, mode, err := Installed(ctx, tx)
		switch {
		case err == nil && mode == ModeSchema:
			return fmt.Errorf("lease: InstallExtension: %w: pg_lease %s is installed as a plain schema (InstallSchema); drop schema lease first to convert",
				ErrModeMismatch, v)
		case err == nil:
			return checkVersion("InstallExtension", v, mode)
		case !errors.Is(err, ErrNotInstalled):
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_lease`); err != nil {
			return fmt.Errorf("lease: InstallExtension: %w", err)
		}
		v, mode, err = Installed(ctx, tx)
		if err != nil {
			return fmt.Errorf("lease: InstallExtension: after CREATE EXTENSION: %w", err)
		}
		if err := checkVersion("InstallExtension", v, mode); err != nil {
			return fmt.Errorf("%w (the server's extension files install %s by default; nothing was installed)", err, v)
		}
		return nil
	})
}

// InstallSchema installs pg_lease without CREATE EXTENSION, for managed
// PostgreSQL that forbids custom extensions: it runs this module's own
// install script (pgleasesql.InstallScript) as plain SQL, with the
// extension-only line removed and @extowner@ replaced by the current role, in
// one transaction (a savepoint when db is a pgx.Tx) under an advisory lock
// that serializes concurrent installers. The role needs CREATE on the
// database; the objects belong to it.
//
// The result is the same schema, functions and privileges as the extension;
// lease.version() records the version, and the schema's comment says it is a
// schema-only install. A second call with the same version is a no-op, as is
// a call where the extension is installed at Version. It returns an error
// matching ErrVersionMismatch when another version is installed (either
// way): upgrades of a schema-only install are not automatic.
func InstallSchema(ctx context.Context, db Beginner) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		v, mode, err := Installed(ctx, tx)
		switch {
		case err == nil:
			return checkVersion("InstallSchema", v, mode)
		case !errors.Is(err, ErrNotInstalled):
			return err
		}
		var role string
		if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
			return fmt.Errorf("lease: InstallSchema: %w", err)
		}
		script, err := SchemaScript(role)
		if err != nil {
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

// SchemaScript is the SQL that InstallSchema runs, with owner (a role name,
// quoted here) as the owner of every object: the install script of Version
// without its "\echo ... \quit" guard, followed by a COMMENT that marks the
// schema-only install.
func SchemaScript(owner string) (string, error) {
	if owner == "" {
		return "", fmt.Errorf("lease: SchemaScript: %w: empty owner", ErrInvalidInput)
	}
	src := pgleasesql.InstallScript()
	lines := strings.SplitAfter(src, "\n")
	var b strings.Builder
	b.Grow(len(src) + 256)
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, `\echo`) {
			continue // the guard against running the script outside CREATE EXTENSION
		}
		if strings.HasPrefix(t, `\`) {
			return "", fmt.Errorf("lease: SchemaScript: unexpected psql meta-command in the install script: %q", t)
		}
		b.WriteString(l)
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

// inTx runs f in a transaction of db under the install advisory lock and
// commits when f returns nil.
func inTx(ctx context.Context, db Beginner, f func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("lease: install: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1)`, int64(installLockKey)); err != nil {
		return fmt.Errorf("lease: install: taking the install lock: %w", err)
	}
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("lease: install: commit: %w", err)
	}
	return nil
}

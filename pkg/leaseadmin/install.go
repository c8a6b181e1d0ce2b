package leaseadmin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/lease"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

var (
	// ErrVersionMismatch: the installed pg_lease has another version than
	// this module ships.
	ErrVersionMismatch = errors.New("lease: installed pg_lease version differs")
	// ErrModeMismatch: pg_lease is installed, but in the other mode than the
	// one asked for (InstallExtension over a schema-only install).
	ErrModeMismatch = errors.New("lease: pg_lease is installed in the other mode")
)

// Version is the pg_lease version this module speaks and installs.
const Version = pgleasesql.Version

// Installed reports which pg_lease version is installed in the database q is
// connected to, and how: extension is true when it was installed by CREATE
// EXTENSION (InstallExtension), false when as a plain schema (InstallSchema).
// It reads the catalogs only (Describe) and calls nothing in schema lease.
// With neither present it returns an error matching lease.ErrNotInstalled.
// It returns an error matching ErrSquatted when schema lease is not
// pg_lease's, or, for a schema-only install, when the schema or an object in
// it belongs to a role that cannot act as the current role: such an install
// is someone else's, not one this role made (Describe reports it).
func Installed(ctx context.Context, q lease.Querier) (version string, extension bool, err error) {
	in, err := Describe(ctx, q)
	if err != nil {
		return "", false, err
	}
	if !in.Extension {
		if err := in.trust(""); err != nil {
			return "", false, err
		}
	}
	return in.Version, in.Extension, nil
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
func InstallExtension(
	ctx context.Context,
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	},
) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		in, err := Describe(ctx, tx)
		if err == nil {
			err = in.trust("lease: InstallExtension")
		}
		v, ext := in.Version, in.Extension
		switch {
		case err == nil && !ext:
			return fmt.Errorf("lease: InstallExtension: %w: pg_lease %s is installed as a plain schema (InstallSchema); drop schema lease first to convert",
				ErrModeMismatch, v)
		case err == nil && v == Version:
			return nil
		case err == nil:
			if _, uerr := pgleasesql.UpdateScripts(v); uerr != nil {
				return checkVersion("InstallExtension", v, ext)
			}
			if _, err := tx.Exec(ctx, `ALTER EXTENSION pg_lease UPDATE TO `+quoteLiteral(Version)); err != nil {
				return fmt.Errorf("lease: InstallExtension: updating pg_lease %s to %s: %w", v, Version, err)
			}
		case !errors.Is(err, lease.ErrNotInstalled):
			return err
		default:
			if _, err := tx.Exec(ctx, `CREATE EXTENSION pg_lease VERSION `+quoteLiteral(Version)); err != nil {
				return fmt.Errorf("lease: InstallExtension: %w", err)
			}
		}
		in, err = trusted(ctx, tx, "lease: InstallExtension: after CREATE EXTENSION")
		if err != nil {
			return err
		}
		return checkVersion("InstallExtension", in.Version, in.Extension)
	})
}

// InstallSchema installs pg_lease without CREATE EXTENSION, for managed
// PostgreSQL that forbids custom extensions: it runs this module's own SQL
// (the full install script of Version, or the direct update script from an
// older version: the same files CREATE EXTENSION runs) as plain SQL, with the
// extension-only lines removed and @extowner@ replaced by the current role,
// in one transaction (a savepoint when db is a pgx.Tx). The role needs CREATE
// on the database; the objects belong to it. The script runs with
// search_path pinned to pg_catalog, so no other role's function or operator
// in the caller's schemas is called; the caller's search_path is restored.
//
// The result is the same schema, functions and privileges as the extension;
// lease.version() records the version, and the schema's comment says it is a
// schema-only install. A second call with the same version is a no-op, as is
// a call where the extension is installed at Version; a schema-only install
// of an older version is updated with the update scripts. It returns an error
// matching ErrVersionMismatch when a newer or unknown version is installed,
// or the extension at another version. Concurrent installers are safe.
func InstallSchema(
	ctx context.Context,
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	},
) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		in, err := Describe(ctx, tx)
		if err == nil {
			err = in.trust("lease: InstallSchema")
		}
		v, ext := in.Version, in.Extension
		var from string
		switch {
		case err == nil && (v == Version || ext):
			return checkVersion("InstallSchema", v, ext)
		case err == nil:
			from = v
		case !errors.Is(err, lease.ErrNotInstalled):
			return err
		}
		var role string
		if err := tx.QueryRow(ctx, `SELECT CURRENT_USER::pg_catalog.text`).Scan(&role); err != nil {
			return fmt.Errorf("lease: InstallSchema: %w", err)
		}
		script, err := pgleasesql.SchemaScript(role, from)
		if err != nil {
			if from != "" {
				return checkVersion("InstallSchema", v, ext)
			}
			return fmt.Errorf("lease: InstallSchema: %w", err)
		}
		if _, err := tx.Exec(ctx, script); err != nil {
			return fmt.Errorf("lease: InstallSchema: running the install script: %w", err)
		}
		in, err = trusted(ctx, tx, "lease: InstallSchema: after the install script")
		if err != nil {
			return err
		}
		return checkVersion("InstallSchema", in.Version, in.Extension)
	})
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func checkVersion(op, v string, extension bool) error {
	if v != Version {
		mode := "schema"
		if extension {
			mode = "extension"
		}
		return fmt.Errorf("lease: %s: %w: pg_lease %s is installed (%s), this module speaks %s",
			op, ErrVersionMismatch, v, mode, Version)
	}
	return nil
}

// beginner is what the installers need of the database: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx have it.
type beginner = interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// inTx runs f in a transaction of db and commits when f returns nil. Two
// installers racing in one database both try to create schema lease (or the
// extension); the loser waits for the winner's commit and then fails on a
// catalog unique index. inTx then rolls back and runs f once more, which
// finds the winner's install. (No advisory lock: pg_lease uses none.)
func inTx(ctx context.Context, db beginner, f func(pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := inTxOnce(ctx, db, f)
		var pg *pgconn.PgError
		if attempt < 2 && errors.As(err, &pg) && (pg.Code == "23505" || pg.Code == "42P06" || pg.Code == "42710") {
			continue // unique_violation, duplicate_schema, duplicate_object: lost an install race
		}
		return err
	}
}

// inTxOnce runs f in one transaction (pgx.BeginFunc). It pins search_path
// to pg_catalog for f, so that no function or operator that another role
// created in the caller's schemas runs, and restores the caller's
// search_path before the commit.
func inTxOnce(ctx context.Context, db beginner, f func(pgx.Tx) error) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var path string
		if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('search_path')`).Scan(&path); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)`); err != nil {
			return err
		}
		if err := f(tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('search_path', $1, true)`, path)
		return err
	})
	if err != nil {
		return fmt.Errorf("lease: install: %w", err)
	}
	return nil
}

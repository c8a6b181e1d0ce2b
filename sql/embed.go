// Package pgleasesql embeds the pg_lease extension's SQL so that Go code
// installs exactly the files in this folder: there is one copy of the SQL.
// SchemaScript assembles from it the script of a schema-only install (what
// lease.InstallSchema runs).
package pgleasesql

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Version is the extension version this module ships (default_version in
// pg_lease.control).
const Version = "0.3.0"

//go:embed pg_lease.control pg_lease--*.sql
var files embed.FS

// Files returns the extension's control file and scripts by base name
// (pg_lease.control, pg_lease--0.1.0.sql, upgrade scripts), as PostgreSQL
// expects them in its extension directory.
func Files() map[string][]byte {
	out := map[string][]byte{}
	names, _ := fs.Glob(files, "*")
	sort.Strings(names)
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			panic(err) // embedded at build time: cannot fail
		}
		out[path.Base(n)] = b
	}
	return out
}

// InstallScript returns the base install script (the one version that has a
// full install script; later versions are reached through update scripts).
func InstallScript() string {
	b, err := files.ReadFile("pg_lease--" + BaseVersion + ".sql")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// BaseVersion is the version with a full install script. CREATE EXTENSION
// installs it and then follows the update scripts up to Version, as the
// schema-only installer does.
const BaseVersion = "0.1.0"

// UpdateScripts returns, in order, the update scripts that take an
// installation from version from to Version (none when from is Version). It
// fails when no chain of pg_lease--A--B.sql files leads from from to Version
// (for example when from is newer than Version).
func UpdateScripts(from string) ([]string, error) {
	var out []string
	for v := from; v != Version; {
		names, _ := fs.Glob(files, "pg_lease--"+v+"--*.sql")
		if len(names) != 1 {
			return nil, fmt.Errorf("pg_lease: no update path from version %s to %s", from, Version)
		}
		b, err := files.ReadFile(names[0])
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
		v = strings.TrimSuffix(strings.TrimPrefix(names[0], "pg_lease--"+v+"--"), ".sql")
		if len(out) > 100 {
			return nil, fmt.Errorf("pg_lease: update scripts from %s loop", from)
		}
	}
	return out, nil
}

// SchemaScript is the SQL that installs pg_lease as a plain schema, without
// CREATE EXTENSION (what lease.InstallSchema runs), with owner (a role name,
// quoted here) as the owner of every object: from a database without
// pg_lease (from ""), the base install script and every update script up to
// Version; from a schema-only install of version from, the update scripts
// from there. The scripts' "\echo ... \quit" guards are left out, and a
// COMMENT that marks the schema-only install follows them.
func SchemaScript(owner, from string) (string, error) {
	if owner == "" {
		return "", fmt.Errorf("pg_lease: SchemaScript: empty owner")
	}
	var srcs []string
	if from == "" {
		srcs = append(srcs, InstallScript())
		from = BaseVersion
	}
	updates, err := UpdateScripts(from)
	if err != nil {
		return "", fmt.Errorf("pg_lease: SchemaScript: %w", err)
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
				return "", fmt.Errorf("pg_lease: SchemaScript: unexpected psql meta-command in the SQL: %q", t)
			}
			b.WriteString(l)
		}
		b.WriteString("\n")
	}
	out := strings.ReplaceAll(b.String(), "@extowner@", pgx.Identifier{owner}.Sanitize())
	if i := strings.Index(out, "@ext"); i >= 0 {
		end := min(len(out), i+24)
		return "", fmt.Errorf("pg_lease: SchemaScript: unhandled extension placeholder near %q", out[i:end])
	}
	out += fmt.Sprintf("\nCOMMENT ON SCHEMA lease IS %s;\n",
		quoteLiteral("pg_lease "+Version+": time-bounded leases with fencing epochs (schema-only install, without CREATE EXTENSION)"))
	return out, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Package pgleasesql embeds the pg_lease extension's SQL so that Go code
// installs exactly the files in this folder: there is one copy of the SQL.
// SchemaScript picks from it the script of a schema-only install (what
// leaseadmin.InstallSchema runs): the full script of Version, or the direct
// update script from an older version.
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
const Version = "0.5.0"

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

// InstallScript returns the full install script of BaseVersion.
func InstallScript() string {
	b, err := files.ReadFile("pg_lease--" + BaseVersion + ".sql")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// BaseVersion is the version with a full install script: Version itself.
// CREATE EXTENSION runs that one script, as the schema-only installer does.
// (The released scripts of older versions run only when a version is named
// explicitly, as the upgrade tests do.)
const BaseVersion = Version

// UpdateScripts returns the update script that takes an installation from
// version from to Version: one direct script (none when from is Version).
// It fails when there is no pg_lease--from--Version.sql (for example when
// from is newer than Version).
func UpdateScripts(from string) ([]string, error) {
	if from == Version {
		return nil, nil
	}
	b, err := files.ReadFile("pg_lease--" + from + "--" + Version + ".sql")
	if err != nil {
		return nil, fmt.Errorf("pg_lease: no update path from version %s to %s", from, Version)
	}
	return []string{string(b)}, nil
}

// SchemaScript is the SQL that installs pg_lease as a plain schema, without
// CREATE EXTENSION (what leaseadmin.InstallSchema runs), with owner (a role name,
// quoted here) as the owner of every object: from a database without
// pg_lease (from ""), the full install script of Version; from a schema-only
// install of version from, the direct update script from there. The
// script's "\echo ... \quit" guard is left out, and a COMMENT that marks
// the schema-only install follows it. The script's first statement pins
// search_path for the rest of the transaction: the caller restores it.
func SchemaScript(owner, from string) (string, error) {
	if owner == "" {
		return "", fmt.Errorf("pg_lease: SchemaScript: empty owner")
	}
	var srcs []string
	switch from {
	case "":
		srcs = append(srcs, InstallScript())
	case Version:
		return "", fmt.Errorf("pg_lease: SchemaScript: version %s is installed already", from)
	default:
		updates, err := UpdateScripts(from)
		if err != nil {
			return "", fmt.Errorf("pg_lease: SchemaScript: %w", err)
		}
		srcs = append(srcs, updates...)
	}
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
	if firstStatement(out) != pinSearchPath {
		return "", fmt.Errorf("pg_lease: SchemaScript: the script does not pin search_path first")
	}
	out += fmt.Sprintf("\nCOMMENT ON SCHEMA lease IS %s;\n",
		quoteLiteral("pg_lease "+Version+": time-bounded leases with fencing epochs (schema-only install, without CREATE EXTENSION)"))
	return out, nil
}

// pinSearchPath is the first statement of every install and update script
// (after its comments and guard).
const pinSearchPath = "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);"

// firstStatement returns the first line of script that is neither blank
// nor a comment.
func firstStatement(script string) string {
	for _, l := range strings.Split(script, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
			return t
		}
	}
	return ""
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Package pgleasesql embeds the pg_lease extension's SQL so that Go code
// installs exactly the files in this folder: there is one copy of the SQL.
package pgleasesql

import (
	"embed"
	"io/fs"
	"path"
	"sort"
)

// Version is the extension version this module ships (default_version in
// pg_lease.control).
const Version = "0.1.0"

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

// InstallScript returns the install script of Version.
func InstallScript() string {
	b, err := files.ReadFile("pg_lease--" + Version + ".sql")
	if err != nil {
		panic(err)
	}
	return string(b)
}

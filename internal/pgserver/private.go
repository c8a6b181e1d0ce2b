package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Layout is where a PostgreSQL installation keeps its programs, libraries
// and shared files (the extension directory is ShareDir/extension), as its
// server reports them. A relocatable installation's directories move with
// its binaries: the server finds them relative to the postgres binary.
type Layout struct {
	BinDir, ShareDir, PkgLibDir, LibDir string
}

// Layout reads the installation directories of the running server (its
// pg_config view).
func (s *Server) Layout(ctx context.Context) (Layout, error) {
	if s.external {
		return Layout{}, fmt.Errorf("%w: Layout of the external server of %s", ErrNeedsThrowaway, EnvTestDSN)
	}
	var l Layout
	err := s.admin(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT name, setting FROM pg_catalog.pg_config
			WHERE name IN ('BINDIR', 'SHAREDIR', 'PKGLIBDIR', 'LIBDIR')`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, setting string
			if err := rows.Scan(&name, &setting); err != nil {
				return err
			}
			switch name {
			case "BINDIR":
				l.BinDir = setting
			case "SHAREDIR":
				l.ShareDir = setting
			case "PKGLIBDIR":
				l.PkgLibDir = setting
			case "LIBDIR":
				l.LibDir = setting
			}
		}
		return rows.Err()
	})
	if err != nil {
		return Layout{}, fmt.Errorf("pgserver: Layout: %w", err)
	}
	if l.BinDir == "" || l.ShareDir == "" || l.PkgLibDir == "" || l.LibDir == "" {
		return Layout{}, fmt.Errorf("pgserver: Layout: incomplete pg_config view: %+v", l)
	}
	return l, nil
}

// PrivateInstallation makes, in dir (an empty directory that the server's
// user can read), an installation of l whose server reads extension files
// from a directory of its own, so that a test may put any extension files
// there without touching l's extension directory, which others use.
//
// The server finds its share and library directories relative to the
// postgres binary after resolving symbolic links, so the binary is copied,
// and each of l's directories keeps its absolute path under dir. Everything
// else links to l's files: the other programs (pg_config is left out: it
// would report l's directories), the libraries, the shared files and the
// extension files l has. A file written into the new extension directory
// replaces the link (pgserver.InstallFiles renames over it), never l's file.
// It returns the new bin and extension directories.
func PrivateInstallation(dir string, l Layout) (binDir, extDir string, err error) {
	for _, p := range []string{l.BinDir, l.ShareDir, l.PkgLibDir, l.LibDir} {
		if !filepath.IsAbs(p) {
			return "", "", fmt.Errorf("pgserver: PrivateInstallation: %q is not an absolute path", p)
		}
	}
	inside := func(p, parent string) bool {
		return p == parent || strings.HasPrefix(p, parent+string(filepath.Separator))
	}
	// The library directories become links: they must not hold the
	// directories that are made here.
	libs := []string{l.LibDir}
	if !inside(l.PkgLibDir, l.LibDir) {
		libs = append(libs, l.PkgLibDir)
	}
	for _, lib := range libs {
		if inside(l.BinDir, lib) || inside(l.ShareDir, lib) || inside(lib, l.BinDir) || inside(lib, l.ShareDir) {
			return "", "", fmt.Errorf("pgserver: PrivateInstallation: %s overlaps the bin or share directory (%+v)", lib, l)
		}
	}
	under := func(p string) string { return filepath.Join(dir, p) }

	binDir = under(l.BinDir)
	if err := linkEntries(l.BinDir, binDir, func(name string) string {
		switch name {
		case "postgres":
			return "copy"
		case "pg_config":
			return "skip"
		}
		return "link"
	}); err != nil {
		return "", "", err
	}
	share := under(l.ShareDir)
	if err := linkEntries(l.ShareDir, share, func(name string) string {
		if name == "extension" {
			return "skip"
		}
		return "link"
	}); err != nil {
		return "", "", err
	}
	extDir = filepath.Join(share, "extension")
	if err := linkEntries(filepath.Join(l.ShareDir, "extension"), extDir, func(string) string { return "link" }); err != nil {
		return "", "", err
	}
	for _, lib := range libs {
		if err := os.MkdirAll(filepath.Dir(under(lib)), 0o755); err != nil {
			return "", "", fmt.Errorf("pgserver: PrivateInstallation: %w", err)
		}
		if err := os.Symlink(lib, under(lib)); err != nil {
			return "", "", fmt.Errorf("pgserver: PrivateInstallation: %w", err)
		}
	}
	return binDir, extDir, nil
}

// linkEntries creates dst and, for each entry of src, a symbolic link to it,
// a copy of it, or nothing, as what(name) says ("link", "copy", "skip").
func linkEntries(src, dst string, what func(name string) string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("pgserver: PrivateInstallation: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("pgserver: PrivateInstallation: %w", err)
	}
	for _, e := range ents {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		switch what(e.Name()) {
		case "link":
			err = os.Symlink(from, to)
		case "copy":
			err = copyFile(from, to)
		}
		if err != nil {
			return fmt.Errorf("pgserver: PrivateInstallation: %w", err)
		}
	}
	return nil
}

// copyFile copies the file src (following links) to dst with src's mode.
func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New(src + " is not a regular file")
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(out, in)
	return err
}

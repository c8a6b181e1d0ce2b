package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

// ExtensionDir returns the extension directory (<sharedir>/extension) of the
// server installation: from pg_config next to the binaries when there is
// one, otherwise from the running server's pg_config view.
func (s *Server) ExtensionDir(ctx context.Context) (string, error) {
	if s.external {
		return "", fmt.Errorf("%w: the extension directory of the external server of %s is not reachable from here",
			ErrNeedsThrowaway, EnvTestDSN)
	}
	if pgConfig := filepath.Join(s.binDir, "pg_config"); fileExists(pgConfig) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, pgConfig, "--sharedir").Output()
		if dir := strings.TrimSpace(string(out)); err == nil && dir != "" {
			return filepath.Join(dir, "extension"), nil
		}
	}
	var dir string
	err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").Scan(&dir)
	})
	if err != nil {
		return "", fmt.Errorf("pgserver: finding the extension directory (no pg_config in %s; the server must be running): %w",
			s.binDir, err)
	}
	return filepath.Join(dir, "extension"), nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// InstallExtensionFiles copies the pg_lease control file and scripts
// (pgleasesql.Files) into the server installation's extension directory, so
// that CREATE EXTENSION pg_lease works in its databases. Only files whose
// content differs are rewritten, each atomically (concurrent test binaries
// may do the same). It needs write access there (as root, usually).
//
// On an external server it cannot copy anything: it succeeds when that server
// already offers pg_lease at pgleasesql.Version, and otherwise says what to
// install.
func (s *Server) InstallExtensionFiles(ctx context.Context) error {
	if s.external {
		var ok bool
		err := s.admin(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_available_extension_versions WHERE name = 'pg_lease' AND version = $1)",
				pgleasesql.Version).Scan(&ok)
		})
		if err != nil {
			return fmt.Errorf("pgserver: InstallExtensionFiles: %w", err)
		}
		if !ok {
			return fmt.Errorf("%w: the external server of %s does not offer pg_lease %s; install the files of sql/ on it (make -C sql install)",
				ErrNeedsThrowaway, EnvTestDSN, pgleasesql.Version)
		}
		return nil
	}
	dir, err := s.ExtensionDir(ctx)
	if err != nil {
		return err
	}
	return InstallFiles(dir, pgleasesql.Files())
}

// InstallFiles writes files (base name to content) into dir, rewriting only
// those whose content differs, atomically (temporary file and rename), mode
// 0644.
func InstallFiles(dir string, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for n := range files {
		if n != filepath.Base(n) || n == "." || n == ".." {
			return fmt.Errorf("pgserver: InstallFiles: %q is not a base name", n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		dst := filepath.Join(dir, n)
		if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, files[n]) {
			continue
		}
		if err := writeAtomic(dst, files[n]); err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("pgserver: installing extension files needs write access to %s "+
					"(run the tests as root, or install them once with `make -C sql install` as root): %w", dir, err)
			}
			return fmt.Errorf("pgserver: installing %s: %w", dst, err)
		}
	}
	return nil
}

func writeAtomic(dst string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".pgtest-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

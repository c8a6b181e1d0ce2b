package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvBinDir names the variable that points the harness at a directory holding
// initdb and postgres (for example another major version from a cache). The
// caller sets LD_LIBRARY_PATH when those binaries need it; the harness passes
// its environment on to the server.
const EnvBinDir = "PGLEASE_PG_BINDIR"

// EnvLibFaketime optionally names libfaketime.so.1 when it is not in one of
// the usual places.
const EnvLibFaketime = "PGLEASE_LIBFAKETIME"

// errNoBinaries is wrapped by FindBinDir when no installation is found.
var errNoBinaries = errors.New("pgserver: no PostgreSQL server binaries (initdb, postgres) found")

// FindBinDir returns the directory of the PostgreSQL server binaries the
// harness uses, searching in this order: $PGLEASE_PG_BINDIR; `pg_config
// --bindir`; the newest /usr/lib/postgresql/*/bin; PATH.
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if err := hasServerBinaries(dir); err != nil {
			return "", fmt.Errorf("pgserver: %s=%s: %w", EnvBinDir, dir, err)
		}
		return dir, nil
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			dir := strings.TrimSpace(string(out))
			if hasServerBinaries(dir) == nil {
				return dir, nil
			}
		}
	}
	if dir := newestDebianBinDir(); dir != "" {
		return dir, nil
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			if dir := filepath.Dir(real); hasServerBinaries(dir) == nil {
				return dir, nil
			}
		}
		if dir := filepath.Dir(initdb); hasServerBinaries(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w: install them with `apt-get install postgresql` (Debian/Ubuntu), "+
		"or set %s to a directory holding initdb and postgres", errNoBinaries, EnvBinDir)
}

func hasServerBinaries(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("no %s in %s", name, dir)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s in %s is not executable", name, dir)
		}
	}
	return nil
}

// newestDebianBinDir returns the bin directory of the highest major version
// under /usr/lib/postgresql, or "".
func newestDebianBinDir() string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	type cand struct {
		dir     string
		version float64
	}
	var cands []cand
	for _, m := range matches {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(m)), 64)
		if err != nil || hasServerBinaries(m) != nil {
			continue
		}
		cands = append(cands, cand{m, v})
	}
	if len(cands) == 0 {
		return ""
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].version > cands[j].version })
	return cands[0].dir
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?`)

// serverVersion runs `postgres --version` (as the user the server will run
// as, which also proves that user can execute the binaries) and returns the
// full version line and the major version.
func serverVersion(ctx context.Context, binDir string, cred *syscall.Credential) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "postgres"), "--version")
	cmd.Dir = os.TempDir()
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		hint := ""
		if cred != nil {
			hint = fmt.Sprintf(" (this process is root, so the server runs as uid %d: the installation, every "+
				"directory above %s and the libraries in LD_LIBRARY_PATH must be readable and searchable by "+
				"that user; keep them outside /root, which is mode 0700)", cred.Uid, binDir)
		}
		msg := strings.TrimSpace(out.String())
		if msg != "" {
			msg = ": " + msg
		}
		return "", 0, fmt.Errorf("pgserver: %s --version: %v%s%s", filepath.Join(binDir, "postgres"), err, msg, hint)
	}
	line := strings.TrimSpace(out.String())
	m := versionRE.FindStringSubmatch(line)
	if m == nil {
		return "", 0, fmt.Errorf("pgserver: cannot parse server version from %q", line)
	}
	major, _ := strconv.Atoi(m[1])
	return line, major, nil
}

// unprivilegedCredential returns the credential to run initdb and postgres
// with when this process is root (PostgreSQL refuses to run as root), or nil.
func unprivilegedCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	uid, gid := uint32(65534), uint32(65534)
	if u, err := user.Lookup("nobody"); err == nil {
		if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
			uid = uint32(n)
		}
		if n, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			gid = uint32(n)
		}
	}
	for _, name := range []string{"nogroup", "nobody"} {
		if g, err := user.LookupGroup(name); err == nil {
			if n, err := strconv.ParseUint(g.Gid, 10, 32); err == nil {
				gid = uint32(n)
				break
			}
		}
	}
	return &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}, nil
}

// FindLibFaketime returns the path of libfaketime.so.1 ($PGLEASE_LIBFAKETIME,
// then the multiarch and plain library directories).
func FindLibFaketime() (string, error) {
	if p := os.Getenv(EnvLibFaketime); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("pgserver: %s=%s: %w", EnvLibFaketime, p, err)
		}
		return p, nil
	}
	var cands []string
	for _, pattern := range []string{
		"/usr/lib/*/faketime/libfaketime.so.1",
		"/usr/lib/faketime/libfaketime.so.1",
		"/usr/lib64/faketime/libfaketime.so.1",
		"/usr/local/lib/faketime/libfaketime.so.1",
		"/usr/local/lib/libfaketime.so.1",
	} {
		m, _ := filepath.Glob(pattern)
		cands = append(cands, m...)
	}
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("pgserver: FakeClock needs libfaketime, which is not installed: run `apt-get install faketime` "+
		"(or set %s to libfaketime.so.1)", EnvLibFaketime)
}

// UnprivilegedCredential is the credential servers run with when this
// process is root (nobody:nogroup), or nil when it is not root.
func UnprivilegedCredential() (*syscall.Credential, error) { return unprivilegedCredential() }

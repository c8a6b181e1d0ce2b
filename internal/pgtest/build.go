package pgtest

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

var built struct {
	mu   sync.Mutex
	bins map[string]string // import path → binary
	dir  string
}

// BuildProgram builds the main package pkg (an import path, for example
// testprog.CandidatePkg) once per test binary and returns the binary's path.
// The binaries are removed by Main. It fails the test when the go command
// is missing or the build fails.
func BuildProgram(t testing.TB, pkg string) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if bin, ok := built.bins[pkg]; ok {
		return bin
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "/usr/local/go/bin/go"
			if _, err := os.Stat(goBin); err != nil {
				t.Fatalf("building %s needs the go command (not on PATH, not in $GOROOT/bin or /usr/local/go/bin)", pkg)
			}
		}
	}
	if built.dir == "" {
		if built.dir, err = os.MkdirTemp("", "pgtest-bin-"); err != nil {
			t.Fatal(err)
		}
		built.bins = map[string]string{}
	}
	bin := filepath.Join(built.dir, path.Base(pkg))
	if out, err := exec.Command(goBin, "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	built.bins[pkg] = bin
	return bin
}

func removeBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
		built.dir, built.bins = "", nil
	}
}

package pgtest

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
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
	return BuildPrograms(t, pkg)[pkg]
}

// BuildPrograms is BuildProgram for several packages, with one go command
// for those not built yet: it builds them in parallel. It returns each
// binary's path by import path.
func BuildPrograms(t testing.TB, pkgs ...string) map[string]string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	var todo []string
	for _, pkg := range pkgs {
		if _, ok := built.bins[pkg]; !ok && !slices.Contains(todo, pkg) {
			todo = append(todo, pkg)
		}
	}
	if len(todo) > 0 {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
			if _, err := os.Stat(goBin); err != nil {
				goBin = "/usr/local/go/bin/go"
				if _, err := os.Stat(goBin); err != nil {
					t.Fatalf("building %s needs the go command (not on PATH, not in $GOROOT/bin or /usr/local/go/bin)", strings.Join(todo, " "))
				}
			}
		}
		if built.dir == "" {
			if built.dir, err = os.MkdirTemp("", "pgtest-bin-"); err != nil {
				t.Fatal(err)
			}
			built.bins = map[string]string{}
		}
		// go build -o DIR/ writes each main package into DIR under its last
		// path element.
		args := append([]string{"build", "-o", built.dir + string(filepath.Separator)}, todo...)
		if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", strings.Join(todo, " "), err, out)
		}
		for _, pkg := range todo {
			built.bins[pkg] = filepath.Join(built.dir, path.Base(pkg))
		}
	}
	out := map[string]string{}
	for _, pkg := range pkgs {
		out[pkg] = built.bins[pkg]
	}
	return out
}

func removeBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
		built.dir, built.bins = "", nil
	}
}

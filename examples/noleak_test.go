package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// secret is the password of every DSN handed to the examples here.
const secret = "Hunter2-Do-Not-Print"

// The examples this package owns; examples/fenced-writer has its own owner
// and test.
var examples = []string{"clientgo", "manager", "operator", "kubebuilder"}

func build(t *testing.T, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command(goBin, "build", "-o", bin, "./"+name).CombinedOutput(); err != nil {
		t.Fatalf("go build ./%s: %v\n%s", name, err, out)
	}
	return bin
}

// No example prints a password from its environment: not in -h, not after
// a bad flag or a bad flag value, not when the DSN does not parse or the
// server cannot be reached (URL and keyword/value DSNs).
func TestNoPasswordInOutput(t *testing.T) {
	kubeconfig := pgtest.UnreachableKubeconfig(t)
	dsns := map[string]string{
		"url":              "postgres://app:" + secret + "@127.0.0.1:1/leases?sslmode=disable&connect_timeout=1",
		"keyword":          "host=127.0.0.1 port=1 user=app password=" + secret + " dbname=leases sslmode=disable connect_timeout=1",
		"unparsable url":   "postgres://app:" + secret + "@127.0.0.1:notaport/leases",
		"unparsable words": "host=127.0.0.1 port=notaport password=" + secret,
	}
	runs := map[string][]string{
		"help":         {"-h"},
		"--help":       {"--help"},
		"unknown flag": {"-no-such-flag"},
		"bad value":    {"-lease-duration=banana"},
		"run":          {"-kubeconfig", kubeconfig, "-id", "x", "--leader-elect", "--leader-elect-resource-lock=pglease", "--leader-elect-resource-namespace=default"},
	}
	for _, name := range examples {
		bin := build(t, name)
		for run, args := range runs {
			if run == "run" {
				args = runArgs(name, kubeconfig)
			}
			for kind, dsn := range dsns {
				t.Run(name+"/"+run+"/"+kind, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					cmd := exec.CommandContext(ctx, bin, args...)
					cmd.Env = append(os.Environ(), "PGLEASE_DSN="+dsn, "PGLEASE_STORE_DSN="+dsn, "KUBECONFIG="+kubeconfig)
					out, _ := cmd.CombinedOutput() // exit status varies: -h exits 0 or 2, a run is killed
					if strings.Contains(string(out), secret) {
						t.Errorf("%s %v printed the password:\n%s", name, args, out)
					}
					if len(out) == 0 {
						t.Errorf("%s %v printed nothing: the check would prove nothing", name, args)
					}
				})
			}
		}
	}
}

// runArgs gets each example past flag parsing to where it uses the DSN.
func runArgs(name, kubeconfig string) []string {
	switch name {
	case "clientgo":
		return []string{"-id", "x", "-lease-duration", "2s", "-renew-deadline", "1s", "-retry-period", "200ms"}
	case "manager":
		return []string{"-kubeconfig", kubeconfig, "-id", "x", "-health-probe-bind-address", "0"}
	case "operator":
		return []string{"-kubeconfig", kubeconfig, "-id", "x", "-health-probe-bind-address", "127.0.0.1:0"}
	default: // kubebuilder
		return []string{"-kubeconfig", kubeconfig, "--leader-elect", "--leader-elect-resource-lock=pglease",
			"--leader-elect-resource-namespace=default", "--health-probe-bind-address=0"}
	}
}

package main_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/internal/pgtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// startControlPlane starts etcd and kube-apiserver built by
// hack/build-control-plane.sh (a cached build returns at once; a cold one
// takes about a quarter of an hour), through envtest, on loopback only. It
// returns a kubeconfig file and a client.
func startControlPlane(t *testing.T) (string, client.Client) {
	t.Helper()
	root := repoRoot(t)
	out, err := exec.Command("bash", filepath.Join(root, "hack", "build-control-plane.sh")).Output()
	if err != nil {
		t.Fatalf("hack/build-control-plane.sh: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	no := false
	env := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		UseExistingCluster:       &no,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
		ControlPlane: envtest.ControlPlane{
			Etcd:      &envtest.Etcd{Path: filepath.Join(dir, "etcd")},
			APIServer: &envtest.APIServer{Path: filepath.Join(dir, "kube-apiserver")},
		},
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("starting the control plane from %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	t.Logf("control plane started in %v at %s", time.Since(start).Round(time.Millisecond), cfg.Host)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfig, c
}

func newDB(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	if err := pgtest.Shared(t).InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

type line struct {
	proc, kind, arg, tok string
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(t *testing.T, bin, id, dsn string, lines chan<- line, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-id", id}, args...)...)
	cmd.Env = append(os.Environ(), "PGLEASE_DSN="+dsn)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) >= 4 && (f[1] == "reconciled" || f[1] == "fenced"):
				lines <- line{proc: id, kind: f[1], arg: f[2], tok: f[3]}
			case len(f) >= 3:
				lines <- line{proc: id, kind: f[1], tok: f[2]}
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	return p
}

func epochOf(tok string) int64 {
	e, _ := strconv.ParseInt(tok[strings.LastIndexByte(tok, '@')+1:], 10, 64)
	return e
}

// Two processes of examples/manager against a real kube-apiserver and a real
// PostgreSQL: the leader stamps a ConfigMap with its epoch; on SIGTERM it
// releases, and the other process becomes leader and stamps the same
// ConfigMap with the released epoch + 2.
func TestManagerExample(t *testing.T) {
	kubeconfig, c := startControlPlane(t)
	dsn := newDB(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "manager")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo",
		Labels: map[string]string{"pglease.io/example": "true"}}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	// Not selected: never stamped.
	unlabelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "not-mine"}}
	if err := c.Create(ctx, unlabelled); err != nil {
		t.Fatal(err)
	}

	lines := make(chan line, 1000)
	procs := map[string]*proc{}
	// The DSN comes from $PGLEASE_DSN (startProc), as in config/.
	args := []string{"-kubeconfig", kubeconfig, "-namespace", "default", "-key", "manager-example", "-lease-duration", "2s"}
	probes := map[string]string{}
	for _, id := range []string{"m1", "m2"} {
		probes[id] = freeAddr(t)
		procs[id] = startProc(t, bin, id, dsn, lines, append(args, "-health-probe-bind-address", probes[id])...)
	}
	seen := pgtest.NewEvents(lines)
	wait := func(what string, match func(line) bool) line {
		t.Helper()
		return seen.Await(t, 2*time.Minute, what, match)
	}
	annotation := func() (int64, string) {
		var got corev1.ConfigMap
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "demo"}, &got); err != nil {
			t.Fatal(err)
		}
		e, _ := strconv.ParseInt(got.Annotations["pglease.io/epoch"], 10, 64)
		return e, got.Annotations["pglease.io/holder"]
	}

	first := wait("the leader's reconcile", func(l line) bool { return l.kind == "reconciled" && l.arg == "default/demo" })
	if e, h := annotation(); e != epochOf(first.tok) || h != first.proc {
		t.Fatalf("ConfigMap stamped %d by %q; the leader reconciled under %s", e, h, first.tok)
	}
	other := "m1"
	if first.proc == "m1" {
		other = "m2"
	}
	// The probes are wired: /healthz runs the lock's check, /readyz answers.
	for _, id := range []string{"m1", "m2"} {
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get("http://" + probes[id] + path)
			if err != nil {
				t.Fatalf("%s %s: %v", id, path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d %s", id, path, resp.StatusCode, body)
			}
		}
	}
	stopped := time.Now()
	if err := procs[first.proc].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	second := wait("the successor's reconcile", func(l line) bool { return l.kind == "reconciled" && l.arg == "default/demo" })
	t.Logf("%s (%s) stopped; %s reconciled under %s %v later", first.proc, first.tok, second.proc, second.tok,
		time.Since(stopped).Round(time.Millisecond))
	if second.proc != other || epochOf(second.tok) != epochOf(first.tok)+2 {
		t.Fatalf("successor reconcile %+v after %+v", second, first)
	}
	if e, h := annotation(); e != epochOf(second.tok) || h != other {
		t.Fatalf("ConfigMap stamped %d by %q after the handoff", e, h)
	}
	for _, name := range []string{"not-mine"} { // (envtest runs no kube-controller-manager: no kube-root-ca.crt)
		var got corev1.ConfigMap
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		if _, ok := got.Annotations["pglease.io/epoch"]; ok {
			t.Errorf("ConfigMap %s, outside the label selector, was stamped: %v", name, got.Annotations)
		}
	}
	<-procs[first.proc].done
	if err := procs[first.proc].err; err != nil {
		t.Fatalf("%s exited with %v after SIGTERM", first.proc, err)
	}
	if err := procs[other].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-procs[other].done
	if procs[other].err != nil {
		t.Fatalf("%s exited with %v after SIGTERM", other, procs[other].err)
	}
}

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

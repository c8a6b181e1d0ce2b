// Package kubetest starts a real Kubernetes control plane for tests: etcd
// and kube-apiserver built from the Go module proxy by
// hack/build-control-plane.sh (once per machine, cached), run through
// controller-runtime's envtest on loopback addresses only.
package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// controlPlaneStartTimeout bounds how long etcd and kube-apiserver may take to
// become healthy; generous because a 2-core machine may be busy with other
// tests.
const controlPlaneStartTimeout = 2 * time.Minute

var (
	controlPlaneOnce sync.Once
	controlPlaneDir  string
	controlPlaneErr  error
)

// Assets runs hack/build-control-plane.sh once per test binary and
// returns the folder holding the etcd and kube-apiserver binaries. A cold
// build takes about a quarter of an hour on 2 cores (run the script before
// `go test`, or raise -timeout); a cached one returns at once.
func Assets() (string, error) {
	controlPlaneOnce.Do(func() {
		controlPlaneDir, controlPlaneErr = buildControlPlane()
	})
	return controlPlaneDir, controlPlaneErr
}

func buildControlPlane() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "hack", "build-control-plane.sh")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Dir = root
	cmd.Stdout = &stdout
	// Progress of a cold build goes to the test's stderr as it happens, and
	// is kept for the failure message.
	cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s failed: %w\n%s", script, err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(stdout.String())
	if dir == "" || strings.Contains(dir, "\n") {
		return "", fmt.Errorf("%s printed %q on stdout, want one folder path\n%s", script, stdout.String(), stderr.String())
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s: %s is missing or not executable in %s (stat error: %v)", script, name, dir, err)
		}
	}
	return dir, nil
}

// repoRoot walks up from the working directory to the folder holding the main
// module's go.mod.
// RepoRoot is the directory holding go.mod, at or above the working one.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod found above the working directory")
		}
		dir = parent
	}
}

// Start builds (or reuses) etcd and kube-apiserver from
// hack/build-control-plane.sh, starts a fresh control plane through envtest on
// loopback addresses only, and stops it when the test ends. It returns an
// admin (system:masters) config. A failed build fails the test; it never
// skips.
func Start(t testing.TB) *rest.Config {
	t.Helper()
	cp, err := start(t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane from %s started in %v at %s", cp.dir, cp.took.Round(time.Millisecond), cp.cfg.Host)
	t.Cleanup(func() {
		start := time.Now()
		if err := cp.stop(); err != nil {
			t.Errorf("stopping envtest control plane: %v", err)
		}
		t.Logf("control plane stopped in %v", time.Since(start).Round(time.Millisecond))
	})
	return cp.cfg
}

var shared struct {
	once   sync.Once
	cp     *controlPlane
	logDir string
	err    error
}

// Shared is Start for the tests of a test binary that need no control
// plane of their own: the first call starts one, later calls return the
// same config, and StopShared (from TestMain, after m.Run) stops it. Those
// tests keep to objects of their own (their own namespace or names): the
// control plane runs no controllers, so one test's objects never act on
// another's.
func Shared(t testing.TB) *rest.Config {
	t.Helper()
	shared.once.Do(func() {
		if shared.logDir, shared.err = os.MkdirTemp("", "pglease-control-plane-"); shared.err != nil {
			return
		}
		shared.cp, shared.err = start(shared.logDir, t.Logf)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	t.Logf("shared control plane from %s (started in %v) at %s", shared.cp.dir, shared.cp.took.Round(time.Millisecond),
		shared.cp.cfg.Host)
	return shared.cp.cfg
}

// StopShared stops the control plane that Shared started, if any, and
// removes its logs.
func StopShared() error {
	if shared.cp == nil {
		if shared.logDir != "" {
			os.RemoveAll(shared.logDir)
		}
		return nil
	}
	err := shared.cp.stop()
	shared.cp = nil
	if err != nil {
		return fmt.Errorf("stopping the shared control plane: %w (logs in %s)", err, shared.logDir)
	}
	os.RemoveAll(shared.logDir)
	return nil
}

// controlPlane is a running envtest control plane.
type controlPlane struct {
	env        *envtest.Environment
	cfg        *rest.Config
	dir        string // of the binaries
	took       time.Duration
	logs       []*os.File
	stopReaper func()
}

func (cp *controlPlane) stop() error {
	if cp.stopReaper != nil {
		cp.stopReaper()
	}
	err := cp.env.Stop()
	for _, f := range cp.logs {
		f.Close()
	}
	return err
}

// start starts a control plane with its logs in logDir.
func start(logDir string, logf func(string, ...any)) (*controlPlane, error) {
	dir, err := Assets()
	if err != nil {
		return nil, fmt.Errorf("building the test control plane: %w", err)
	}
	etcdLog, err := os.Create(filepath.Join(logDir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	apiLog, err := os.Create(filepath.Join(logDir, "kube-apiserver.log"))
	if err != nil {
		etcdLog.Close()
		return nil, err
	}

	useExisting := false
	env := &envtest.Environment{
		// Explicit paths, so that KUBEBUILDER_ASSETS or TEST_ASSET_* in the
		// environment cannot swap in other binaries, and never an existing
		// cluster (USE_EXISTING_CLUSTER) or a download.
		BinaryAssetsDirectory:    dir,
		UseExistingCluster:       &useExisting,
		DownloadBinaryAssets:     false,
		ControlPlaneStartTimeout: controlPlaneStartTimeout,
		ControlPlaneStopTimeout:  time.Minute,
		ControlPlane: envtest.ControlPlane{
			Etcd: &envtest.Etcd{
				Path: filepath.Join(dir, "etcd"),
				Out:  etcdLog,
				Err:  etcdLog,
			},
			// envtest picks free ports on localhost for etcd's client and
			// peer URLs and the API server's secure port, and advertises
			// 127.0.0.1; the addresses are checked after the start.
			APIServer: &envtest.APIServer{
				Path: filepath.Join(dir, "kube-apiserver"),
				Out:  apiLog,
				Err:  apiLog,
			},
		},
	}
	cp := &controlPlane{env: env, dir: dir, logs: []*os.File{etcdLog, apiLog}}
	begin := time.Now()
	before := children(dir)
	cp.cfg, err = env.Start()
	if err != nil {
		// Stop whatever did start before failing.
		stopErr := cp.stop()
		return nil, fmt.Errorf("starting envtest control plane from %s: %v (stop: %v)\netcd log tail:\n%s\nkube-apiserver log tail:\n%s",
			dir, err, stopErr, Tail(etcdLog.Name()), Tail(apiLog.Name()))
	}
	cp.took = time.Since(begin)
	cp.stopReaper = reapOnExit(logf, before, children(dir))
	for _, u := range []string{cp.cfg.Host, env.ControlPlane.Etcd.URL.String()} {
		if err := requireLoopback(u); err != nil {
			cp.stop()
			return nil, err
		}
	}
	return cp, nil
}

// children returns this process's child processes running a binary of dir.
func children(dir string) map[int]bool {
	out := map[int]bool{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: state, ppid, ...
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(self) {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && filepath.Dir(exe) == filepath.Clean(dir) {
			out[pid] = true
		}
	}
	return out
}

// reapOnExit starts a watcher that kills the control plane's processes
// (those in after and not in before) if this test process dies without
// stopping them, as a killed `go test` would. The returned func stops the
// watcher; call it before the control plane is stopped.
func reapOnExit(logf func(string, ...any), before, after map[int]bool) func() {
	args := []string{"-c", `p=$1; shift; tail --pid="$p" -f /dev/null; kill -9 "$@" 2>/dev/null`, "reaper", strconv.Itoa(os.Getpid())}
	for pid := range after {
		if !before[pid] {
			args = append(args, strconv.Itoa(pid))
		}
	}
	if len(args) == 5 {
		logf("no etcd or kube-apiserver child found to watch: a killed test would leave them running")
		return func() {}
	}
	cmd := exec.Command("bash", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf("starting the control plane's reaper: %v", err)
		return func() {}
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

func requireLoopback(host string) error {
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("control plane host %q: %w", host, err)
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("control plane serves on %q, want a loopback IP address", host)
	}
	return nil
}

// Tail is the end of the file at path (its last 4000 bytes).
func Tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// WriteKubeconfig writes a kubeconfig file for cfg (the envtest admin).
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		CertificateAuthority:     cfg.CAFile,
	}
	kc.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientCertificate:     cfg.CertFile,
		ClientKeyData:         cfg.KeyData,
		ClientKey:             cfg.KeyFile,
		Token:                 cfg.BearerToken,
		Username:              cfg.Username,
		Password:              cfg.Password,
	}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

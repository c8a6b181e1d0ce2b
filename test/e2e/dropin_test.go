package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The LeaderElectionID of examples/kubebuilder (as kubebuilder scaffolds it)
// and the pg_lease key the flags make of it.
const (
	scaffoldElectionID = "b7d3e2a1.example.com"
	scaffoldKey        = "default/" + scaffoldElectionID
)

type scaffoldProc struct {
	cmd     *exec.Cmd
	log     string
	metrics string
	probes  string
	exited  chan struct{}
}

func startScaffold(t *testing.T, bin, kubeconfig, dsn string, extra ...string) *scaffoldProc {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	probePort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &scaffoldProc{metrics: fmt.Sprintf("127.0.0.1:%d", port), probes: fmt.Sprintf("127.0.0.1:%d", probePort),
		exited: make(chan struct{}), log: filepath.Join(t.TempDir(), "scaffold.log")}
	args := append([]string{
		"--kubeconfig", kubeconfig,
		"--leader-elect",
		"--leader-elect-resource-lock=pglease",
		"--leader-elect-resource-namespace=default",
		"--leader-elect-lease-duration=3s",
		"--leader-elect-renew-deadline=1500ms",
		"--leader-elect-retry-period=300ms",
		"--metrics-bind-address=" + p.metrics,
		"--metrics-secure=false",
		"--health-probe-bind-address=" + p.probes,
	}, extra...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "PGLEASE_DSN="+dsn, "KUBECONFIG=")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("scaffold log:\n%s", tail(p.log))
		}
	})
	return p
}

// dropinWaitFor polls f (a bound of a minute, not an assertion on time).
func dropinWaitFor(t *testing.T, what string, f func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		ok, err := f()
		if ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: not within a minute (last error: %v)", what, last)
}

func dropinScrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestKubebuilderScaffold runs examples/kubebuilder, the kubebuilder main.go
// switched in three lines, with --leader-elect-resource-lock=pglease on a
// real kube-apiserver: the controller-runtime manager elects through the
// pg_lease key default/<LeaderElectionID> (no Lease is created), serves the
// lock's epoch beside controller-runtime's leader_election_master_status,
// records "became leader (epoch N)" Events on the manager's recorder, and a
// second replica takes over with the next epoch when the first stops.
func TestKubebuilderScaffold(t *testing.T) {
	cfg := StartControlPlane(t)
	kubeconfig := writeKubeconfig(t, cfg)
	dsn := dropinLeaseDB(t)
	bin := dropinBuild(t, "./examples/kubebuilder")
	kube, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	leases := lease.New(newPool(t, dsn))
	ctx := context.Background()

	held := func(epoch int64) (string, bool, error) {
		s, err := leases.Inspect(ctx, scaffoldKey)
		if err != nil {
			return "", false, err
		}
		return s.Owner, s.Held && s.Epoch == epoch, nil
	}
	a := startScaffold(t, bin, kubeconfig, dsn)
	var holderA string
	dropinWaitFor(t, "the first replica to hold "+scaffoldKey+" at epoch 1", func() (ok bool, err error) {
		holderA, ok, err = held(1)
		return ok, err
	})

	// Metrics: the lock's epoch and controller-runtime's leader gauge.
	epochLine := regexp.MustCompile(`(?m)^pg_lease_lock_epoch\{key="` + regexp.QuoteMeta(scaffoldKey) + `"\} 1$`)
	dropinWaitFor(t, "pg_lease_lock_epoch 1 on the metrics endpoint", func() (bool, error) {
		m, err := dropinScrape(a.metrics)
		return epochLine.MatchString(m) &&
			strings.Contains(m, `leader_election_master_status{name="`+scaffoldElectionID+`"} 1`), err
	})

	// The lock's health check is part of /healthz.
	dropinWaitFor(t, "/healthz/leader-election-pglease to answer 200", func() (bool, error) {
		resp, err := http.Get("http://" + a.probes + "/healthz/leader-election-pglease")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d", resp.StatusCode)
	})

	// The election went to PostgreSQL, not to a Lease.
	var l coordinationv1.Lease
	if err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: scaffoldElectionID}, &l); !apierrors.IsNotFound(err) {
		t.Fatalf("a Lease %s exists (or: %v): the scaffold elected through the Kubernetes API", scaffoldElectionID, err)
	}

	event := func(holder string, epoch int64) func() (bool, error) {
		want := fmt.Sprintf("%s became leader (epoch %d)", holder, epoch)
		return func() (bool, error) {
			var evs corev1.EventList
			if err := kube.List(ctx, &evs, client.InNamespace("default")); err != nil {
				return false, err
			}
			for _, ev := range evs.Items {
				if ev.Reason == "LeaderElection" && ev.Message == want && ev.InvolvedObject.Kind == "Lease" &&
					ev.InvolvedObject.Name == scaffoldElectionID {
					return true, nil
				}
			}
			return false, fmt.Errorf("no event %q among %d", want, len(evs.Items))
		}
	}
	dropinWaitFor(t, "the became-leader Event of epoch 1", event(holderA, 1))

	// A second replica takes over when the first stops (the scaffold leaves
	// LeaderElectionReleaseOnCancel false, and the flags do not override
	// it: the successor waits for the TTL).
	startScaffold(t, bin, kubeconfig, dsn)
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	<-a.exited
	var holderB string
	dropinWaitFor(t, "the second replica to hold the key at epoch 2", func() (ok bool, err error) {
		holderB, ok, err = held(2)
		return ok, err
	})
	if holderB == holderA {
		t.Fatalf("epoch 2 held by %s, the stopped replica", holderA)
	}
	dropinWaitFor(t, "the became-leader Event of epoch 2", event(holderB, 2))
}

// Wrong flags fail before anything runs, naming the field; a missing DSN
// names where it was looked for.
func TestKubebuilderScaffoldRefuses(t *testing.T) {
	bin := dropinBuild(t, "./examples/kubebuilder")
	// An unreachable server: nothing gets that far.
	kubeconfig := pgtest.UnreachableKubeconfig(t)
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"timings past the TTL", "PGLEASE_DSN=postgres://u:" + leakSecret + "@127.0.0.1:1/db",
			[]string{"--leader-elect-renew-deadline=13s"}, "leaderElection.renewDeadline"},
		{"no DSN", "PGLEASE_DSN=", nil, "$PGLEASE_DSN is empty or unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--kubeconfig", kubeconfig, "--leader-elect", "--leader-elect-resource-lock=pglease",
				"--leader-elect-resource-namespace=default", "--health-probe-bind-address=0"}, tc.args...)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), tc.env, "KUBECONFIG=")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("exited 0:\n%s", out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, out)
			}
			if strings.Contains(string(out), leakSecret) {
				t.Errorf("output shows the password:\n%s", out)
			}
		})
	}
}

const leakSecret = "Leak-Me-N0t"

package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOwnerDeath: when the test process dies without stopping its control
// plane, etcd and kube-apiserver are killed too (a killed `go test` would
// otherwise leave them running).
func TestOwnerDeath(t *testing.T) {
	if os.Getenv("KUBETEST_ABANDON") != "" {
		Start(t)
		dir, err := Assets()
		if err != nil {
			t.Fatal(err)
		}
		var pids []string
		for pid := range children(dir) {
			pids = append(pids, strconv.Itoa(pid))
		}
		fmt.Println("ABANDON " + strings.Join(pids, " "))
		os.Exit(0) // no cleanup, as if killed
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOwnerDeath$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "KUBETEST_ABANDON=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var pids []int
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "ABANDON" {
			for _, s := range f[1:] {
				pid, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("helper output %q: %v", line, err)
				}
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) != 2 {
		t.Fatalf("want the pids of etcd and kube-apiserver from the helper, got %v; output:\n%s", pids, out)
	}
	// The reaper notices its owner's death within a second; allow a busy
	// machine far more.
	deadline := time.Now().Add(time.Minute)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("control plane process %d outlived its owner by a minute", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// running reports whether pid is a live process (a zombie is dead: its
// parent, init here, may not reap it at once).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

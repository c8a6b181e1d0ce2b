package ha

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pglease/pg_lease/internal/kubetest"
	"github.com/pglease/pg_lease/internal/pgtest"
)

// operatorKey is the pg_lease key the controller-runtime managers elect
// through (examples/operator's -election-id).
const operatorKey = "operator"

// opEvent is one line of examples/operator's standard output.
type opEvent struct {
	Event string `json:"event"`
	ID    string `json:"id"`
	Epoch int64  `json:"epoch"`
	at    time.Time
}

// operators runs examples/operator (a controller-runtime manager electing
// through pkg/leaderelection and pkg/resourcelock) in three slots on the
// test kube-apiserver, restarting a process whenever it exits, as a
// Deployment would. Each reconciles one ConfigMap, which the test updates
// every writeEvery: every reconcile of the leader is a write through
// fence.PGGuard into the store, here the cluster itself (database ha,
// through the multi-host DSN), so that a write after a promotion is a write
// on the new primary.
type operators struct {
	w          *world
	bin        string
	kubeconfig string
	kube       client.Client
	logDir     string

	mu     sync.Mutex
	events []opEvent
	gens   map[int]int
}

func (w *world) startOperators(n int) {
	cfg := kubetest.Start(w.t)
	// Stop the operators and the ConfigMap's updates before the control
	// plane (cleanups run last-registered first).
	w.t.Cleanup(w.shutdown)
	kube, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		w.t.Fatal(err)
	}
	o := &operators{w: w, bin: pgtest.BuildProgram(w.t, "github.com/pglease/pg_lease/examples/operator"),
		kubeconfig: kubetest.WriteKubeconfig(w.t, cfg), kube: kube, logDir: w.t.TempDir(), gens: map[int]int{}}
	ctx := pgtest.Context(w.t, time.Minute)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ha", Labels: map[string]string{"pglease.example/watch": "true"}},
		Data:       map[string]string{"n": "0"},
	}
	if err := kube.Create(ctx, cm); err != nil {
		w.t.Fatal(err)
	}
	w.keys = append(w.keys, operatorKey)
	w.ops = o
	w.t.Cleanup(func() {
		if !w.t.Failed() {
			return
		}
		o.mu.Lock()
		evs := o.events[max(0, len(o.events)-40):]
		var lines []string
		for _, ev := range evs {
			lines = append(lines, fmt.Sprintf("%s %s %s epoch %d", ev.at.Format("15:04:05.000"), ev.ID, ev.Event, ev.Epoch))
		}
		logs := []string{}
		for slot, gen := range o.gens {
			logs = append(logs, fmt.Sprintf("op%d-%d", slot, gen-1))
		}
		o.mu.Unlock()
		w.t.Logf("operators' last events:\n%s", strings.Join(lines, "\n"))
		for _, id := range logs {
			w.t.Logf("%s's log (tail):\n%s", id, kubetest.Tail(filepath.Join(o.logDir, id+".log")))
		}
	})
	for slot := range n {
		w.wg.Go(func() { o.run(slot) })
	}
	w.wg.Go(o.update)
}

// update changes the ConfigMap every writeEvery.
func (o *operators) update() {
	ctx := o.w.runCtx
	for i := 1; ctx.Err() == nil; i++ {
		uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var cm corev1.ConfigMap
		err := o.kube.Get(uctx, types.NamespacedName{Namespace: "default", Name: "ha"}, &cm)
		if err == nil {
			patch := client.MergeFrom(cm.DeepCopy())
			cm.Data["n"] = strconv.Itoa(i)
			err = o.kube.Patch(uctx, &cm, patch)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			o.w.t.Logf("updating the ConfigMap: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(writeEvery):
		}
	}
}

// run keeps an operator process running in slot until the mode ends.
func (o *operators) run(slot int) {
	ctx := o.w.runCtx
	for ctx.Err() == nil {
		if err := o.once(ctx, slot); err != nil && ctx.Err() == nil {
			o.w.t.Errorf("operator slot %d: %v", slot, err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (o *operators) once(ctx context.Context, slot int) error {
	o.mu.Lock()
	gen := o.gens[slot]
	o.gens[slot]++
	o.mu.Unlock()
	id := fmt.Sprintf("op%d-%d", slot, gen)
	logf, err := os.Create(filepath.Join(o.logDir, id+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(o.bin,
		"-kubeconfig", o.kubeconfig,
		"-id", id,
		"-namespace", "default",
		"-election-id", operatorKey,
		"-lease-duration", ttl.String(),
		"-renew-deadline", "2s",
		"-retry-period", "400ms",
		"-health-probe-bind-address", "127.0.0.1:0",
		"-warmup",
	)
	cmd.Env = append(os.Environ(), "PGLEASE_DSN="+o.w.dsn, "PGLEASE_STORE_DSN="+o.w.dsn)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	stopped := context.AfterFunc(ctx, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
	defer stopped()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var ev opEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		ev.at, ev.ID = time.Now(), id
		o.mu.Lock()
		o.events = append(o.events, ev)
		o.mu.Unlock()
		if ev.Event == "write" {
			o.w.opWrite(id, ev)
		}
	}
	_ = cmd.Wait() // an exit after a lost leadership is expected
	return nil
}

// opWrite records an operator's accepted store write as a fenced write on
// the primary: the store is the cluster, and after a promotion only the
// new primary takes writes.
func (w *world) opWrite(id string, ev opEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, write{key: operatorKey, who: id, epoch: ev.Epoch, seq: -1, port: -1, guarded: true, at: ev.at})
}

// terms returns the operators' terms from their epoch-start and epoch-end
// events (an epoch-start without an end lasts until the process exited).
func (o *operators) terms() []term {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []term
	open := map[string]int{}
	for _, ev := range o.events {
		switch ev.Event {
		case "epoch-start":
			open[ev.ID] = len(out)
			out = append(out, term{key: operatorKey, who: ev.ID, epoch: ev.Epoch, start: ev.at, fromEvents: true})
		case "epoch-end", "exit":
			if i, ok := open[ev.ID]; ok {
				out[i].end = ev.at
				delete(open, ev.ID)
			}
		}
	}
	return out
}

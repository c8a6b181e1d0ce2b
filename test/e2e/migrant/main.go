// Command migrant is the process of the migration test
// (test/e2e/migration_test.go): a controller-runtime manager configured by
// the --leader-elect* flags through pkg/leaderelection, as a kubebuilder
// operator switched to pg_lease is, with one leader-only runnable that, for
// as long as the manager leads, writes a row (its -id, the server's
// clock_timestamp()) into the table referee of the database in
// $MIGRANT_REFEREE_DSN every -interval. Two leaders at once interleave their
// rows; the test counts that.
//
// The same binary runs old pods (--leader-elect-resource-lock=leases),
// migrating pods (leases+pglease) and migrated ones (pglease).
//
// Standard output, one JSON object a line:
//
//	{"event":"started","id":...}               the manager is about to start
//	{"event":"leading","id":...,"epoch":E}     the leader-only runnable started (E: the pg_lease epoch, 0 for leases)
//	{"event":"stopped","id":...}               the runnable returned
//	{"event":"exit","id":...,"error":...}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5/pgxpool"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

var (
	outMu sync.Mutex
	id    string
)

func emit(ev map[string]any) {
	ev["id"] = id
	ev["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(ev)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(b))
}

func main() {
	le := pgle.BindFlags(flag.CommandLine)
	flag.StringVar(&id, "id", "", "this process's name (also its pg_lease identity)")
	interval := flag.Duration("interval", 20*time.Millisecond, "how often the leader writes a referee row")
	flag.Parse()
	ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{}))
	le.Config.Identity = id
	err := run(le, *interval)
	emit(map[string]any{"event": "exit", "error": fmt.Sprint(err)})
	if err != nil {
		os.Exit(1)
	}
}

func run(le *pgle.Flags, interval time.Duration) error {
	ctx := ctrl.SetupSignalHandler()
	referee, err := pgxpool.New(context.Background(), os.Getenv("MIGRANT_REFEREE_DSN"))
	if err != nil {
		return err
	}
	defer referee.Close()
	mgr, err := le.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		LeaderElectionID:              "migrant",
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
	})
	if err != nil {
		return err
	}
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		var epoch int64
		if pg := pgle.LockOf(mgr); pg != nil {
			if t, ok := pg.Token(); ok {
				epoch = t.Epoch
			}
		}
		emit(map[string]any{"event": "leading", "epoch": epoch})
		defer emit(map[string]any{"event": "stopped"})
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if _, err := referee.Exec(ctx, `INSERT INTO referee (id, at) VALUES ($1, clock_timestamp())`, id); err != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "referee:", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}))
	if err != nil {
		return err
	}
	emit(map[string]any{"event": "started"})
	return mgr.Start(ctx)
}

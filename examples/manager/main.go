// Command manager is a controller-runtime manager that elects its leader
// through pg_lease (leaderelection.NewManagerForLock) instead of a
// Kubernetes Lease, and reconciles ConfigMaps under the fencing token of the current epoch
// (leaderelection.Fenced).
//
//	export PGLEASE_DSN=...   # or -dsn-file /path/to/a/file/holding/it
//	go run ./examples/manager -kubeconfig ~/.kube/config -namespace default -id a &
//	go run ./examples/manager -kubeconfig ~/.kube/config -namespace default -id b &
//	kubectl label configmap demo pglease.io/example=true
//
// Only ConfigMaps matching -selector (default pglease.io/example=true) are
// watched and stamped: the manager's cache is scoped by that label
// selector, so it never touches kube-root-ca.crt or any other ConfigMap of
// the namespace. The DSN comes from $PGLEASE_DSN or the file named by
// -dsn-file, never from a flag default (-dsn still takes one on the command
// line, for tests; it has no default).
//
// The reconciler shows a fenced write to a store other than PostgreSQL: each
// ConfigMap records, in the annotation pglease.io/epoch, the highest epoch
// that has written it, and a reconcile writes only if its own epoch is not
// lower (the update is conditional on the resourceVersion it read, so the
// check and the write are one atomic step). A deposed leader that still runs
// a reconcile can therefore never overwrite its successor's work.
//
// Output lines (one event each, timestamped with the wall clock):
//
//	<time> epoch-start <key>/<id>@<epoch>
//	<time> reconciled <namespace>/<name> <key>/<id>@<epoch>
//	<time> fenced <namespace>/<name> <key>/<id>@<epoch> (seen epoch N)
//	<time> epoch-end <key>/<id>@<epoch>
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Annotations written by the reconciler.
const (
	EpochAnnotation  = "pglease.io/epoch"
	HolderAnnotation = "pglease.io/holder"
)

func main() {
	var (
		dsnFile       = flag.String("dsn-file", "", "file holding the PostgreSQL connection string (default: $PGLEASE_DSN)")
		dsn           = flag.String("dsn", "", "PostgreSQL connection string; visible in process listings, prefer $PGLEASE_DSN or -dsn-file")
		selector      = flag.String("selector", "pglease.io/example=true", "label selector of the ConfigMaps to reconcile")
		key           = flag.String("key", "example-manager", "lease key")
		id            = flag.String("id", "", "this candidate's unique identity (default: lease.DefaultOwner, host-pid-random)")
		namespace     = flag.String("namespace", "default", "namespace whose ConfigMaps are reconciled")
		leaseDuration = flag.Duration("lease-duration", 15*time.Second, "lease TTL; client-go's timings follow from it")
		probeAddr     = flag.String("health-probe-bind-address", ":8081", "address of /healthz (leader election health) and /readyz; \"0\" disables")
		metricsAddr   = flag.String("metrics-bind-address", "0", "address of /metrics (controller-runtime's and the lock's, plain HTTP); \"0\" disables")
	)
	// -kubeconfig is registered by controller-runtime (ctrl.GetConfig).
	flag.Parse()
	if *id == "" {
		*id = lease.DefaultOwner()
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager: -selector:", err)
		os.Exit(2)
	}
	if *dsn == "" {
		if *dsn, err = readDSN(*dsnFile, "PGLEASE_DSN"); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
			os.Exit(2)
		}
	}
	if err := run(*dsn, *key, *id, *namespace, sel, *leaseDuration, *probeAddr, *metricsAddr); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

// readDSN returns the connection string held in file (surrounding white
// space trimmed) or, when file is empty, in $env. Its errors name the file or
// the variable, never any part of the DSN.
func readDSN(file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err // names the path only
		}
		if dsn := strings.TrimSpace(string(b)); dsn != "" {
			return dsn, nil
		}
		return "", fmt.Errorf("the DSN file %s is empty", file)
	}
	if dsn := strings.TrimSpace(os.Getenv(env)); dsn != "" {
		return dsn, nil
	}
	return "", fmt.Errorf("no PostgreSQL DSN: $%s is empty or unset (or pass -dsn-file)", env)
}

var outMu sync.Mutex

func say(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Printf("%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func run(dsn, key, id, namespace string, sel labels.Selector, leaseDuration time.Duration, probeAddr, metricsAddr string) error {
	ctx := ctrl.SetupSignalHandler()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// Warm each new connection: a handoff's first acquire and release then
	// cost what later ones do (no PL/pgSQL compile, no statement prepare).
	pcfg.AfterConnect = lease.WarmConn
	// Never acknowledge a change whose wait for the synchronous standbys was
	// cancelled (lease.ErrCommitUnknown).
	lease.ObserveCommits(&pcfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(pcfg)
	// No cancel request when the process stops (see finishOnStop).
	pcfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return finishOnStop{c.Conn()} }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The process's one listener: the lock's Get waits on it while this
	// replica is a standby, so that it takes over within milliseconds of
	// the leader's release (and at the server's expiry of a crashed
	// leader's grant) instead of at client-go's next RetryPeriod. Closed
	// after the manager stopped (after the release on cancel).
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		return err
	}
	defer w.Close()

	lock, err := resourcelock.New(lease.New(pool), resourcelock.Config{
		Key: key, Identity: id,
		LeaseDuration: leaseDuration,
		Waiter:        w,
		OnEpochChange: func(old, new lease.Token) {
			if old.Epoch != 0 {
				say("epoch-end %s", old)
			}
			if new.Epoch != 0 {
				say("epoch-start %s", new)
			}
		},
	})
	if err != nil {
		return err
	}
	opts := ctrl.Options{
		// SIGTERM hands over at once: the stopping leader frees the key.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{namespace: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: sel}},
		},
	}
	// NewManagerForLock: the options set for the lock (timings checked
	// against the TTL), then the manager, whose event recorder then records
	// "became leader (epoch N)"; the lock's metrics join controller-runtime's
	// registry.
	mgr, err := pgle.NewManagerForLock(cfg, opts, lock)
	if err != nil {
		return err
	}
	// Liveness fails when the lock holds a grant its elector stopped renewing;
	// readiness only says the process serves.
	if err := mgr.AddHealthzCheck("leader-election", lock.Check); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Complete(pgle.Fenced(lock, reconcile.TypedReconciler[reconcile.Request](&configMapReconciler{c: mgr.GetClient()})))
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// configMapReconciler stamps each ConfigMap with the epoch that reconciled
// it, never over a higher one.
type configMapReconciler struct {
	c client.Client
}

func (r *configMapReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	tok, ok := lease.TokenFromContext(ctx)
	if !ok {
		return reconcile.Result{}, fmt.Errorf("no fencing token in the context") // Fenced always sets one
	}
	var cm corev1.ConfigMap
	if err := r.c.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	seen, _ := strconv.ParseInt(cm.Annotations[EpochAnnotation], 10, 64)
	switch {
	case seen > tok.Epoch:
		// A later epoch already wrote here: this process is deposed.
		say("fenced %s %s (seen epoch %d)", req.NamespacedName, tok, seen)
		return reconcile.Result{}, nil
	case seen == tok.Epoch:
		return reconcile.Result{}, nil // already done under this epoch
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[EpochAnnotation] = strconv.FormatInt(tok.Epoch, 10)
	cm.Annotations[HolderAnnotation] = tok.Owner
	// Update carries the resourceVersion read above: if anyone wrote in
	// between, it fails with Conflict and the request is requeued (and
	// checked again).
	if err := r.c.Update(ctx, &cm); err != nil {
		return reconcile.Result{}, err
	}
	say("reconciled %s %s", req.NamespacedName, tok)
	return reconcile.Result{}, nil
}

// finishOnStop is each connection's context handler: pgx interrupts a query
// whose context ended by a socket deadline, and sends a cancel request as
// it does, which PgBouncer 1.18 can exit on (docs/operations.md). A query
// cancelled because the process stops gets 5 s to finish; no lease call
// waits on the server, so none is interrupted. A query past its deadline is
// interrupted at once, as pgx does by default: client-go's renewal still
// ends at RenewDeadline, and leadership never outlives the grant.
type finishOnStop struct{ conn net.Conn }

func (h finishOnStop) HandleCancel(ctx context.Context) {
	var delay time.Duration
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		delay = 5 * time.Second
	}
	_ = h.conn.SetDeadline(time.Now().Add(delay))
}

func (h finishOnStop) HandleUnwatchAfterCancel() { _ = h.conn.SetDeadline(time.Time{}) }

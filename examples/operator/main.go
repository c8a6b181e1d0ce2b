// Command operator is a controller-runtime manager whose leader is elected
// through pg_lease, and whose every external write is fenced by the leader's
// epoch.
//
// It reconciles the ConfigMaps of one namespace that carry a label
// (-selector, default pglease.example/watch=true): for each, it writes a
// result row (the ConfigMap's data, a digest of it, its resourceVersion, the
// writer's identity and epoch) into a table of another PostgreSQL database,
// the store, through fence.PGGuard with the fencing token that the
// reconcile's context carries. The store keeps the highest epoch accepted
// per ConfigMap, so a writer that lost its leadership (paused, partitioned)
// and writes late with its old epoch is rejected, and an append-only audit
// table records every accepted write.
//
//	go run ./examples/operator -kubeconfig ~/.kube/config \
//		-lease-dsn "$LEASE_DSN" -store-dsn "$STORE_DSN" -id "$POD_NAME"
//
// Run it with replicas: each process is a candidate with a unique identity.
// The manager is made by leaderelection.NewManagerForLock (the pg_lease lock,
// release on cancel, client-go timings consistent with the TTL, the
// election's events through the manager's recorder), and the reconciler is
// wrapped in leaderelection.Fenced, which puts the current epoch's token in
// each Reconcile's context and cancels it when the epoch ends. -lock=lease elects through client-go's own coordination.k8s.io Lease
// instead (the epoch is then the Lease's leaseTransitions+1), for
// comparison.
//
// The manager releases the lease when it is stopped (SIGTERM: a successor
// takes over at its next retry, without waiting for the TTL), and exits
// with status 1 when it loses the leadership, as controller-runtime expects:
// the Deployment restarts it as a follower. Probes: /healthz and /readyz
// (the store and the lease database answer, the caches have synced) on -health-probe-bind-address.
//
// Handover (-lock=pglease): -leader-elect-handover newest-version with
// -leader-elect-version makes each follower a candidate of the key, ready
// once the manager's caches have synced (every replica caches the
// ConfigMaps, leader or not). A stopping leader's release then grants the
// key to the ready candidate of the newest version, in the release's own
// transaction: a rolling update moves the leadership once, to a new replica.
//
// Standard output is one JSON object a line, an event each (the end-to-end
// tests read them):
//
//	{"time":..., "event":"start", "id":..., "pid":...}
//	{"event":"epoch-start", "epoch":E}    a term began: tokens of epoch E are handed out
//	{"event":"epoch-end", "epoch":E}      the term ended: reconciles under E were cancelled
//	{"event":"synced"}                    the manager's caches have synced (every replica)
//	{"event":"leading", "epoch":E}        the manager started its leader-only runnables
//	{"event":"reconcile", "resource":..., "epoch":E}  the first Reconcile call under epoch E
//	{"event":"stall", "resource":..., "epoch":E, "rv":...}  a decided write is held back (test hook)
//	{"event":"write", "resource":..., "epoch":E, "rv":...}  the store accepted a write
//	{"event":"stale", "resource":..., "epoch":E, "highest":H}  the store rejected a stale write
//	{"event":"exit", "code":N, "error":...}
//
// Logs (controller-runtime, client-go) go to standard error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// config is what the flags set.
type config struct {
	leaseDSN, storeDSN string
	id                 string
	namespace          string
	selector           string
	lock               string
	electionID         string
	leaseDuration      time.Duration
	renewDeadline      time.Duration
	retryPeriod        time.Duration
	probeAddr          string
	metricsAddr        string
	warmup             bool
	handover           string // "", any, priority, newest-version, oldest-version
	version            string // this candidate's semantic version
}

func main() {
	var c config
	// -kubeconfig is controller-runtime's own flag (else in-cluster config, $KUBECONFIG, ~/.kube/config).
	// No DSN is ever a flag default (usage text and flag errors would print
	// it): the flags default to empty, and the environment (or a file) is
	// read after parsing.
	var leaseDSNFile, storeDSNFile string
	flag.StringVar(&c.leaseDSN, "lease-dsn", "", "database holding the pg_lease leases (-lock=pglease); visible in process listings, prefer $PGLEASE_DSN or -lease-dsn-file")
	flag.StringVar(&leaseDSNFile, "lease-dsn-file", "", "file holding -lease-dsn (default: $PGLEASE_DSN)")
	flag.StringVar(&c.storeDSN, "store-dsn", "", "database the results are written to; visible in process listings, prefer $PGLEASE_STORE_DSN or -store-dsn-file")
	flag.StringVar(&storeDSNFile, "store-dsn-file", "", "file holding -store-dsn (default: $PGLEASE_STORE_DSN)")
	flag.StringVar(&c.id, "id", "", "this candidate's unique identity (default: lease.DefaultOwner, host-pid-random)")
	flag.StringVar(&c.namespace, "namespace", "default", "namespace whose ConfigMaps are reconciled (and of the Lease with -lock=lease)")
	flag.StringVar(&c.selector, "selector", "pglease.example/watch=true", "label selector of the ConfigMaps to reconcile")
	flag.StringVar(&c.lock, "lock", "pglease", "leader election lock: pglease (a pg_lease key) or lease (a coordination.k8s.io Lease)")
	flag.StringVar(&c.electionID, "election-id", "pglease-example-operator", "lease key (pglease) or Lease name (lease)")
	flag.DurationVar(&c.leaseDuration, "lease-duration", 15*time.Second, "lease TTL, and the manager's LeaseDuration")
	flag.DurationVar(&c.renewDeadline, "renew-deadline", 0, "the manager's RenewDeadline (0: 2/3 of the TTL)")
	flag.DurationVar(&c.retryPeriod, "retry-period", 0, "the manager's RetryPeriod (0: 2/15 of the TTL)")
	// The same names as pkg/leaderelection's flags.
	flag.StringVar(&c.handover, "leader-elect-handover", "", "pglease only: register as a candidate of the key and hand it over on release "+
		"to the ready candidate this strategy chooses: priority, newest-version or oldest-version (default: none, the followers race)")
	flag.StringVar(&c.version, "leader-elect-version", "", "this candidate's semantic version, for -leader-elect-handover newest-version and oldest-version")
	flag.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.StringVar(&c.metricsAddr, "metrics-bind-address", "0", `address of /metrics ("0": off)`)
	flag.BoolVar(&c.warmup, "warmup", false, "start the controller's sources while following (controller-runtime's EnableWarmup): a new leader's caches are already synced")
	flag.Parse()
	if c.id == "" {
		c.id = lease.DefaultOwner()
	}
	identity = c.id
	if c.leaseDSN == "" {
		c.leaseDSN, _ = readDSN(leaseDSNFile, "PGLEASE_DSN") // empty: validate says what is missing
	}
	if c.storeDSN == "" {
		c.storeDSN, _ = readDSN(storeDSNFile, "PGLEASE_STORE_DSN")
	}

	err := run(ctrl.SetupSignalHandler(), c)
	code := 0
	if err != nil {
		code = 1
	}
	emit(event{Event: "exit", Code: &code, Err: errString(err)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "operator:", err)
	}
	os.Exit(code)
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
	return "", fmt.Errorf("no PostgreSQL DSN: $%s is empty or unset", env)
}

func (c config) validate() error {
	var errs []error
	if c.storeDSN == "" {
		errs = append(errs, errors.New("-store-dsn-file or $PGLEASE_STORE_DSN is required"))
	}
	if c.lock != "pglease" && c.lock != "lease" {
		errs = append(errs, fmt.Errorf("-lock must be pglease or lease, got %q", c.lock))
	}
	if c.lock == "pglease" && c.leaseDSN == "" {
		errs = append(errs, errors.New("-lease-dsn-file or $PGLEASE_DSN is required with -lock=pglease"))
	}
	if c.id == "" {
		errs = append(errs, errors.New("-id must not be empty"))
	}
	if _, err := labels.Parse(c.selector); err != nil {
		errs = append(errs, fmt.Errorf("-selector: %w", err))
	}
	if c.handover != "" {
		st, err := handover.ParseStrategy(c.handover)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("-leader-elect-handover: %w", err))
		case c.lock != "pglease":
			errs = append(errs, errors.New("-leader-elect-handover needs -lock=pglease"))
		case (st == handover.StrategyNewestVersion || st == handover.StrategyOldestVersion) && c.version == "":
			errs = append(errs, fmt.Errorf("-leader-elect-handover %s needs this candidate's -leader-elect-version", c.handover))
		}
	}
	if err := handover.CheckVersion(c.version); err != nil {
		errs = append(errs, fmt.Errorf("-leader-elect-version: %w", err))
	}
	return errors.Join(errs...)
}

// timing is the manager's leader election timing: the flags, with those
// left 0 in client-go's proportions of the lease duration (2/3 and 2/15:
// 10s and 2s for 15s). They are checked when the manager is configured:
// for -lock=pglease by the lock (leaderelection.NewManagerForLock: also
// RenewDeadline + RetryPeriod below the TTL minus the lock's margin), for
// -lock=lease by client-go.
func (c config) timing() (t struct{ LeaseDuration, RenewDeadline, RetryPeriod time.Duration }) {
	t.LeaseDuration, t.RenewDeadline, t.RetryPeriod = c.leaseDuration, c.leaseDuration*2/3, c.leaseDuration*2/15
	if c.renewDeadline != 0 {
		t.RenewDeadline = c.renewDeadline
	}
	if c.retryPeriod != 0 {
		t.RetryPeriod = c.retryPeriod
	}
	return t
}

func run(ctx context.Context, c config) error {
	if err := c.validate(); err != nil {
		return err
	}
	sel, _ := labels.Parse(c.selector)
	logger := funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), prefix, args)
	}, funcr.Options{})
	ctrl.SetLogger(logger.WithValues("id", c.id))
	emit(event{Event: "start", PID: os.Getpid()})

	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}

	storeCfg, err := pgxpool.ParseConfig(c.storeDSN)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	// A fenced write whose commit's wait for the synchronous standbys was
	// cancelled is lease.ErrCommitUnknown, not success (pkg/fence).
	lease.ObserveCommits(&storeCfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(storeCfg)
	storePool, err := pgxpool.NewWithConfig(ctx, storeCfg)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer closeSoon(storePool)
	setupCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	st, err := newStore(setupCtx, storePool)
	cancel()
	if err != nil {
		return err
	}

	var el *election
	var built atomic.Pointer[manager.Manager] // for the candidate's readiness
	switch c.lock {
	case "pglease":
		el, err = pgleaseElection(ctx, c, cachesSynced(&built))
	case "lease":
		el, err = leaseElection(restCfg, c)
	}
	if err != nil {
		return err
	}
	defer el.close()

	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	timing := c.timing()
	opts := ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{c.namespace: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: sel}},
		},
		Metrics:                 metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress:  c.probeAddr,
		LeaderElectionID:        c.electionID,
		LeaderElectionNamespace: c.namespace,
		LeaseDuration:           &timing.LeaseDuration,
		RenewDeadline:           &timing.RenewDeadline,
		RetryPeriod:             &timing.RetryPeriod,
	}
	mgr, err := el.newManager(restCfg, opts)
	if err != nil {
		return err
	}
	// With -warmup or a handover, the ConfigMap informer is registered
	// before the manager starts, so that a follower's cache holds it: a
	// follower is ready (and a candidate of a handover) once it has synced.
	if c.warmup || c.handover != "" {
		if _, err := mgr.GetCache().GetInformer(ctx, &corev1.ConfigMap{}); err != nil {
			return err
		}
	}
	built.Store(&mgr)
	if err := mgr.AddReadyzCheck("caches", func(*http.Request) error {
		if !cachesSynced(&built)() {
			return errors.New("caches not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	// On every replica, leader or not: report when the caches have synced.
	if err := mgr.Add(followerRunnable(func(ctx context.Context) error {
		if mgr.GetCache().WaitForCacheSync(ctx) {
			emit(event{Event: "synced"})
		}
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("store", pingCheck(storePool)); err != nil {
		return err
	}
	if el.pool != nil {
		if err := mgr.AddReadyzCheck("lease-db", pingCheck(el.pool)); err != nil {
			return err
		}
	}
	// A leader-only runnable: started when the manager starts leading.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		emit(event{Event: "leading", Epoch: el.epoch()})
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}

	r := &reconciler{client: mgr.GetClient(), store: st, id: c.id, writeTimeout: c.leaseDuration}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{
			// Retry soon after a store outage, not after minutes.
			RateLimiter:  workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, time.Second),
			EnableWarmup: &c.warmup,
		}).
		Complete(el.fenced(r))
	if err != nil {
		return err
	}
	// Start returns nil after a signal (having released the lease), and an
	// error when the leadership was lost.
	return mgr.Start(ctx)
}

// cachesSynced reports whether the manager's caches have synced (false
// before the manager exists).
func cachesSynced(mgr *atomic.Pointer[manager.Manager]) func() bool {
	return func() bool {
		m := mgr.Load()
		if m == nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		return (*m).GetCache().WaitForCacheSync(ctx)
	}
}

// followerRunnable runs on every replica, not only on the leader.
type followerRunnable func(context.Context) error

func (f followerRunnable) Start(ctx context.Context) error { return f(ctx) }
func (followerRunnable) NeedLeaderElection() bool          { return false }

// closeSoon closes pool, waiting at most a second: connections to an
// unreachable database (their cancel requests hang) must not hold back the
// exit after a lost leadership.
func closeSoon(pool *pgxpool.Pool) { closeWithin(pool.Close) }

// closeWithin runs closeFn, waiting for it at most a second.
func closeWithin(closeFn func()) {
	done := make(chan struct{})
	go func() { closeFn(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
}

func pingCheck(pool *pgxpool.Pool) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		return pool.Ping(ctx)
	}
}

// event is one line of standard output.
type event struct {
	Time     string `json:"time"`
	Event    string `json:"event"`
	ID       string `json:"id"`
	PID      int    `json:"pid,omitempty"`
	Epoch    int64  `json:"epoch,omitempty"`
	Resource string `json:"resource,omitempty"`
	RV       string `json:"rv,omitempty"`
	Highest  int64  `json:"highest,omitempty"`
	Code     *int   `json:"code,omitempty"`
	Err      string `json:"error,omitempty"`
}

var (
	outMu    sync.Mutex
	identity string // set once in main before anything emits
)

func emit(e event) {
	e.Time = time.Now().UTC().Format(time.RFC3339Nano)
	e.ID = identity
	b, _ := json.Marshal(e)
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

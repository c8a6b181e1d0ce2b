// Command sharded is a controller-runtime manager that runs on every
// replica at once: its ConfigMaps are split into -shards shards, each a
// pg_lease key that one replica holds at a time (pkg/shard), and every
// write is fenced by the epoch of the object's shard.
//
// It reconciles the ConfigMaps of one namespace that carry a label
// (-selector, default pglease.example/watch=true): for each it waits -work
// (an I/O-bound step: a call to a slow external system), then writes a
// result row into a table of another PostgreSQL database, the store,
// through fence.PGGuard with the token of the shard's context, and logs it
// in sharded_writes. The store keeps the highest epoch accepted per
// ConfigMap, so a replica that lost a shard and writes late is rejected.
//
//	go run ./examples/sharded -kubeconfig ~/.kube/config -shards 16 -id "$POD_NAME"
//
// with $PGLEASE_DSN (the lease database) and $PGLEASE_STORE_DSN (the
// store) set, or -lease-dsn-file and -store-dsn-file. No DSN is ever
// printed. Run it with replicas, each with a unique -id. No leader election:
// the Sharder runs on every replica, and a replica reconciles only the
// objects of the shards it holds.
//
// Standard output is one JSON object a line:
//
//	{"event":"start", "id":..., "pid":...}
//	{"event":"acquired", "shard":S, "epoch":E}
//	{"event":"begin", "resource":..., "shard":S, "epoch":E}   a reconcile of an owned shard starts
//	{"event":"write", "resource":..., "shard":S, "epoch":E, "rv":...}
//	{"event":"stale", "resource":..., "shard":S, "epoch":E, "highest":H}
//	{"event":"end", "resource":..., "shard":S, "epoch":E}     the reconcile returned
//	{"event":"stopping"}                                       SIGTERM or SIGINT received
//	{"event":"exit", "code":N, "error":...}
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/shard"
)

type config struct {
	leaseDSN, storeDSN string
	id, controllerName string
	namespace          string
	selector           string
	shards             int
	ttl                time.Duration
	work               time.Duration
	workers            int
	metricsAddr        string
}

func main() {
	var c config
	var leaseDSNFile, storeDSNFile string
	flag.StringVar(&leaseDSNFile, "lease-dsn-file", "", "file holding the lease database's DSN (default: $PGLEASE_DSN)")
	flag.StringVar(&storeDSNFile, "store-dsn-file", "", "file holding the store's DSN (default: $PGLEASE_STORE_DSN)")
	flag.StringVar(&c.id, "id", "", "this replica's unique identity (default: $POD_NAME, else host-pid-random)")
	flag.StringVar(&c.controllerName, "controller", "pglease-example-sharded", "controller name: the prefix of its pg_lease keys")
	flag.StringVar(&c.namespace, "namespace", "default", "namespace whose ConfigMaps are reconciled")
	flag.StringVar(&c.selector, "selector", "pglease.example/watch=true", "label selector of the ConfigMaps to reconcile")
	flag.IntVar(&c.shards, "shards", 16, "number of shards N (fixed for the controller)")
	flag.DurationVar(&c.ttl, "ttl", 10*time.Second, "TTL of the member and shard keys")
	flag.DurationVar(&c.work, "work", 20*time.Millisecond, "time each reconcile waits, as a call to a slow external system")
	flag.IntVar(&c.workers, "workers", 16, "concurrent reconciles per replica")
	flag.StringVar(&c.metricsAddr, "metrics-bind-address", "0", `address of /metrics ("0": off)`)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sharded: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if c.id == "" {
		c.id = os.Getenv("POD_NAME")
	}
	if c.id == "" {
		c.id = lease.DefaultOwner()
	}
	identity = c.id
	c.leaseDSN, _ = readDSN(leaseDSNFile, "PGLEASE_DSN")
	c.storeDSN, _ = readDSN(storeDSNFile, "PGLEASE_STORE_DSN")

	// Log lines carry milliseconds: a rebalance is measured in them.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	ctx := ctrl.SetupSignalHandler()
	go func() {
		<-ctx.Done()
		emit(event{Event: "stopping"})
	}()
	err := run(ctx, c)
	code := 0
	if err != nil {
		code = 1
		fmt.Fprintln(os.Stderr, "sharded:", err)
	}
	emit(event{Event: "exit", Code: &code, Err: errString(err)})
	os.Exit(code)
}

// readDSN returns the DSN in file or, without a file, in $env. Its errors
// name the file or the variable, never any part of the DSN.
func readDSN(file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(os.Getenv(env)), nil
}

func (c config) validate() error {
	var errs []error
	if c.leaseDSN == "" {
		errs = append(errs, errors.New("-lease-dsn-file or $PGLEASE_DSN is required"))
	}
	if c.storeDSN == "" {
		errs = append(errs, errors.New("-store-dsn-file or $PGLEASE_STORE_DSN is required"))
	}
	if c.shards < 1 || c.shards > shard.MaxShards {
		errs = append(errs, fmt.Errorf("-shards must be 1 to %d, got %d", shard.MaxShards, c.shards))
	}
	if c.work < 0 || c.workers < 1 {
		errs = append(errs, fmt.Errorf("-work must not be negative and -workers must be positive"))
	}
	if _, err := labels.Parse(c.selector); err != nil {
		errs = append(errs, fmt.Errorf("-selector: %w", err))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, c config) error {
	if err := c.validate(); err != nil {
		return err
	}
	sel, _ := labels.Parse(c.selector)
	ctrl.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), prefix, args)
	}, funcr.Options{}).WithValues("id", c.id))
	emit(event{Event: "start", PID: os.Getpid()})

	leaseCfg, err := leasePoolConfig(c.leaseDSN)
	if err != nil {
		return err
	}
	leasePool, err := pgxpool.NewWithConfig(ctx, leaseCfg)
	if err != nil {
		return fmt.Errorf("lease database: %w", err)
	}
	defer leasePool.Close()
	storeCfg, err := pgxpool.ParseConfig(c.storeDSN)
	if err != nil {
		return errors.New("the store DSN does not parse")
	}
	// A fenced write whose commit's wait for the synchronous standbys was
	// cancelled is lease.ErrCommitUnknown, not success (pkg/fence).
	lease.ObserveCommits(&storeCfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(storeCfg)
	storePool, err := pgxpool.NewWithConfig(ctx, storeCfg)
	if err != nil {
		return fmt.Errorf("store database: %w", err)
	}
	defer storePool.Close()
	st, err := newStore(ctx, storePool)
	if err != nil {
		return err
	}
	waiter, err := listen.NewWaiter(ctx, leaseCfg.ConnConfig, listen.Options{})
	if err != nil {
		return fmt.Errorf("lease database: %w", err)
	}
	defer waiter.Close()

	lc := lease.New(leasePool)
	var sharder *shard.Sharder
	sharder, err = shard.New(shard.Config{Client: lc, Controller: c.controllerName, Shards: c.shards,
		Identity: c.id, TTL: c.ttl, Waiter: waiter,
		OnAcquired: func(s int) {
			if sctx, done, ok := sharder.Begin(context.Background(), s); ok {
				tok, _ := lease.TokenFromContext(sctx)
				done()
				emit(event{Event: "acquired", Shard: &s, Epoch: tok.Epoch})
			}
		}})
	if err != nil {
		return err
	}

	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{c.namespace: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: sel}},
		},
		Metrics:                metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(sharder); err != nil {
		return err
	}
	r := &reconciler{client: mgr.GetClient(), store: st, id: c.id, work: c.work, sharder: sharder}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}, builder.WithPredicates(sharder.Predicate())).
		WatchesRawSource(sharder.Source(mgr.GetCache(), &corev1.ConfigMapList{}, client.InNamespace(c.namespace))).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: c.workers,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, time.Second),
		}).
		Complete(sharder.Reconciler(r))
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// leasePoolConfig is the lease database's pool: commits observed, and each
// connection warmed (lease.WarmConn) when it opens, so that the first
// release, handover and acquire of a rebalance on it do not plan their
// statements then. The pool opens and warms leaseConns connections in the
// background when it starts and keeps them (MinConns): a replica runs a
// round, a renewal, the take of a handover and releases at once, and a
// connection opened on the way of one of them cost it the connection and
// the warm-up's statements (hundreds of milliseconds on a loaded host).
// Beyond those, two connections are kept idle (opened in the background,
// as the pool checks its health).
func leasePoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the lease DSN does not parse") // the parser's error may quote it
	}
	lease.ObserveCommits(&cfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(cfg)
	cfg.AfterConnect = lease.WarmConn
	cfg.MinIdleConns = leaseIdleConns
	cfg.MaxConns = max(cfg.MaxConns, leaseConns)
	cfg.MinConns = max(cfg.MinConns, leaseConns)
	return cfg, nil
}

const (
	// leaseConns is how many warm lease connections a replica keeps open:
	// the statements a replica may run at once (a round, a renewal, a
	// handover's take, the releases of shards given up) and two more.
	leaseConns = 6
	// leaseIdleConns is how many warm lease connections stay idle beyond
	// those in use, up to the pool's maximum.
	leaseIdleConns = 2
)

// reconciler waits c.work, then writes the ConfigMap's data to the store
// under the shard's token.
type reconciler struct {
	client  client.Reader
	store   *store
	id      string
	work    time.Duration
	sharder *shard.Sharder
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	tok, ok := lease.TokenFromContext(ctx)
	if !ok {
		return reconcile.Result{}, errors.New("no fencing token in the reconcile context")
	}
	s := r.sharder.Of(req.Namespace, req.Name)
	emit(event{Event: "begin", Resource: req.String(), Shard: &s, Epoch: tok.Epoch})
	defer emit(event{Event: "end", Resource: req.String(), Shard: &s, Epoch: tok.Epoch})
	var cm corev1.ConfigMap
	if err := r.client.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	select {
	case <-time.After(r.work):
	case <-ctx.Done():
		return reconcile.Result{}, nil // the shard moved: its new owner reconciles it
	}
	data, _ := json.Marshal(cm.Data)
	err := r.store.guard.WriteResource(ctx, req.String(), tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
INSERT INTO sharded_results (resource, shard, epoch, writer, resource_version, data)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (resource) DO UPDATE SET shard = EXCLUDED.shard, epoch = EXCLUDED.epoch, writer = EXCLUDED.writer,
  resource_version = EXCLUDED.resource_version, data = EXCLUDED.data, written_at = clock_timestamp()`,
			req.String(), s, tok.Epoch, r.id, cm.ResourceVersion, string(data))
		if err != nil {
			return err
		}
		// The log of accepted writes, stamped after the guard's check.
		_, err = tx.Exec(ctx, `INSERT INTO sharded_writes (resource, shard, epoch, writer) VALUES ($1, $2, $3, $4)`,
			req.String(), s, tok.Epoch, r.id)
		return err
	})
	if stale, ok := errors.AsType[*fence.StaleError](err); ok {
		emit(event{Event: "stale", Resource: req.String(), Shard: &s, Epoch: tok.Epoch, Highest: stale.Highest})
		return reconcile.Result{}, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	emit(event{Event: "write", Resource: req.String(), Shard: &s, Epoch: tok.Epoch, RV: cm.ResourceVersion})
	return reconcile.Result{}, nil
}

// store is the database the results go to, behind a guard per ConfigMap.
type store struct{ guard *fence.PGGuard }

const schemaSQL = `
SELECT pg_advisory_xact_lock(7370);
CREATE TABLE IF NOT EXISTS sharded_results (
  resource         text PRIMARY KEY,
  shard            int NOT NULL,
  epoch            bigint NOT NULL,
  writer           text NOT NULL,
  resource_version text NOT NULL,
  data             jsonb NOT NULL,
  written_at       timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS sharded_writes (
  resource   text NOT NULL,
  shard      int NOT NULL,
  epoch      bigint NOT NULL,
  writer     text NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp());`

func newStore(ctx context.Context, pool *pgxpool.Pool) (*store, error) {
	guard, err := fence.NewPGGuard(pool, fence.PGGuardOptions{Table: "sharded_fence"})
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err == nil {
		err = guard.EnsureTable(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &store{guard: guard}, nil
}

type event struct {
	Time     string `json:"time"`
	Event    string `json:"event"`
	ID       string `json:"id"`
	PID      int    `json:"pid,omitempty"`
	Shard    *int   `json:"shard,omitempty"`
	Epoch    int64  `json:"epoch,omitempty"`
	Resource string `json:"resource,omitempty"`
	RV       string `json:"rv,omitempty"`
	Highest  int64  `json:"highest,omitempty"`
	Code     *int   `json:"code,omitempty"`
	Err      string `json:"error,omitempty"`
}

var (
	outMu    sync.Mutex
	identity string
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

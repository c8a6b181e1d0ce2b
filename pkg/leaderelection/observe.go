package leaderelection

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/internal/promreg"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics of the lock a manager elects through, registered in
// controller-runtime's registry (sigs.k8s.io/controller-runtime/pkg/metrics.Registry,
// served on the manager's metrics endpoint) the first time a lock is
// observed. Beside them the same endpoint serves controller-runtime's
// leader_election_master_status{name} (1 while the client-go elector leads)
// and leader_election_slowpath_total{name} (renewals that fell back to Get
// and Update), which know nothing of epochs.
//
//	pg_lease_lock_epoch{key}                        epoch of the lock's live term at scrape time, 0 when it holds none
//	                                                (the highest, if a process observes several locks of one key)
//	pg_lease_lock_transitions_total{key,transition} terms this process saw start ("started") and end ("stopped"),
//	                                                counted at the elector's next call after the change
//	pg_lease_lock_renew_duration_seconds{key}       latency of each Update the elector made while the lock held a
//	                                                live term (a renewal), successful or not; for leases+pglease
//	                                                it covers both halves
//	pg_lease_lock_errors_total{key,op,kind}         failed calls: op get, create, update or release; kind conflict
//	                                                (the lock is someone else's or was lost) or error (anything else:
//	                                                connection, timeout, server). Get's NotFound and Create's
//	                                                AlreadyExists are answers, not errors, and are not counted.
const (
	metricEpoch       = "pg_lease_lock_epoch"
	metricTransitions = "pg_lease_lock_transitions_total"
	metricRenew       = "pg_lease_lock_renew_duration_seconds"
	metricErrors      = "pg_lease_lock_errors_total"
)

var (
	transitionsVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricTransitions,
		Help: "pg_lease terms this process saw start (transition=started) and end (transition=stopped).",
	}, []string{"key", "transition"})
	renewVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    metricRenew,
		Help:    "Latency of the elector's renewals (Update while holding a live term), successful or not.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"key"})
	errorsVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricErrors,
		Help: "Failed lock calls by op (get, create, update, release) and kind (conflict, error).",
	}, []string{"key", "op", "kind"})
	epochs       = &epochCollector{locks: map[string][]*resourcelock.Lock{}}
	registerOnce sync.Once
	registerErr  error
)

// registerMetrics registers the metrics in controller-runtime's registry,
// once per process, as every package registers its metrics
// (pkg/internal/promreg).
func registerMetrics() error {
	registerOnce.Do(func() {
		var err error
		transitionsVec = promreg.Register(metrics.Registry, transitionsVec, &err)
		renewVec = promreg.Register(metrics.Registry, renewVec, &err)
		errorsVec = promreg.Register(metrics.Registry, errorsVec, &err)
		epochs = promreg.Register(metrics.Registry, epochs, &err)
		if err != nil {
			registerErr = fmt.Errorf("leaderelection: registering metrics: %w", err)
		}
	})
	return registerErr
}

// epochCollector reports each observed lock's epoch when scraped, so that a
// term that ended by its local deadline reads 0 at once.
type epochCollector struct {
	mu    sync.Mutex
	locks map[string][]*resourcelock.Lock // by key; a process normally has one per key
}

var epochDesc = prometheus.NewDesc(metricEpoch,
	"Fencing epoch of the pg_lease lock's live term; 0 when it holds none.", []string{"key"}, nil)

func (c *epochCollector) Describe(ch chan<- *prometheus.Desc) { ch <- epochDesc }

func (c *epochCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, ls := range c.locks {
		var e int64
		for _, l := range ls {
			e = max(e, liveEpoch(l))
		}
		ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(e), key)
	}
}

// observedLock is the lock a manager runs when configured by this package.
// It passes every call to the lock it wraps: a pg_lease lock, or a
// composite such as the "leases+pglease" lock over one. It counts the metrics above. The pg_lease lock records the
// elector's events itself (it is given the manager's recorder).
type observedLock struct {
	rl.Interface
	pg  *resourcelock.Lock
	key string

	mu        sync.Mutex
	lastEpoch int64
}

// observe wraps lock, whose epochs are those of pg (lock itself, or the
// pg_lease half of a composite), and registers the metrics.
func observe(lock rl.Interface, pg *resourcelock.Lock) (*observedLock, error) {
	if lock == nil || pg == nil {
		return nil, fmt.Errorf("leaderelection.observe: lock and pg must not be nil")
	}
	if err := registerMetrics(); err != nil {
		return nil, err
	}
	epochs.mu.Lock()
	if !slices.Contains(epochs.locks[pg.Key()], pg) {
		epochs.locks[pg.Key()] = append(epochs.locks[pg.Key()], pg)
	}
	epochs.mu.Unlock()
	return &observedLock{Interface: lock, pg: pg, key: pg.Key()}, nil
}

// Get passes through, counting errors.
func (o *observedLock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	rec, raw, err := o.Interface.Get(ctx)
	if err != nil && !apierrors.IsNotFound(err) {
		o.countError("get", err)
	}
	o.sawEpoch()
	return rec, raw, err
}

// Create passes through, counting errors.
func (o *observedLock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := o.Interface.Create(ctx, ler)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		o.countError("create", err)
	}
	o.sawEpoch()
	return err
}

// Update passes through, timing renewals and counting errors.
func (o *observedLock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	op := "update"
	if ler.HolderIdentity == "" {
		op = "release"
	}
	_, held := o.pg.Token()
	renewal := op == "update" && held
	start := time.Now()
	err := o.Interface.Update(ctx, ler)
	if renewal {
		renewVec.WithLabelValues(o.key).Observe(time.Since(start).Seconds())
	}
	if err != nil {
		o.countError(op, err)
	}
	o.sawEpoch()
	return err
}

func (o *observedLock) countError(op string, err error) {
	kind := "error"
	if apierrors.IsConflict(err) {
		kind = "conflict"
	}
	errorsVec.WithLabelValues(o.key, op, kind).Inc()
}

// sawEpoch counts a change of the live epoch since the last call.
func (o *observedLock) sawEpoch() {
	e := liveEpoch(o.pg)
	o.mu.Lock()
	last := o.lastEpoch
	o.lastEpoch = e
	o.mu.Unlock()
	if e == last {
		return
	}
	if last != 0 {
		transitionsVec.WithLabelValues(o.key, "stopped").Inc()
	}
	if e != 0 {
		transitionsVec.WithLabelValues(o.key, "started").Inc()
	}
}

// liveEpoch is the epoch of the lock's live term, 0 when it holds none.
func liveEpoch(l *resourcelock.Lock) int64 {
	if t, ok := l.Token(); ok {
		return t.Epoch
	}
	return 0
}

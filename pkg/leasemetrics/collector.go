// Package leasemetrics is a Prometheus collector of every key's leadership
// in one database, read from pg_lease itself (lease.health and
// lease.status): who holds each key, its epoch, how long the term has
// lasted, how long a key has had no holder, how often leadership changed,
// and whether a promotion grace is in force. One scrape shows every
// controller's election, whichever process runs it.
//
// Embed it in any process that has a connection pool:
//
//	reg.MustRegister(leasemetrics.New(pool, leasemetrics.Config{}))
//
// or run `pglease serve-metrics`, which serves it. Each scrape runs two
// read-only queries, which take no lock on any key's row. To watch several
// databases from one registry, register one collector per database
// through prometheus.WrapRegistererWith with a label telling them apart.
//
// The alert rules and the Grafana dashboard in config/prometheus use these
// metrics; their tests check that every name they use is one Describe
// sends.
package leasemetrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Config holds a Collector's settings; zero values take the defaults.
type Config struct {
	// Period is the window of the recent-transitions and recent-leaderless
	// metrics (default 1 hour; at least 1 second).
	Period time.Duration
	// Timeout bounds one scrape's queries (default 10 seconds).
	Timeout time.Duration
	// OnError, if set, is called with each scrape's error (the scrape then
	// reports pg_lease_up 0 and no key).
	OnError func(error)
}

// Defaults of Config.
const (
	DefaultPeriod  = time.Hour
	DefaultTimeout = 10 * time.Second
)

// withDefaults returns c with every zero field set to its default, and
// validates the result.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Period == 0:
		c.Period = DefaultPeriod
	case c.Period < time.Second || c.Period > 366*24*time.Hour:
		return c, fmt.Errorf("%w: leasemetrics Config.Period %v: want 1s to 366 days", lease.ErrInvalidInput, c.Period)
	}
	switch {
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: leasemetrics Config.Timeout %v: want a positive duration", lease.ErrInvalidInput, c.Timeout)
	}
	return c, nil
}

// Collector is a prometheus.Collector of one database's keys.
type Collector struct {
	db  lease.Querier
	c   *lease.Client
	cfg Config

	mu       sync.Mutex
	database string // the last database name read, for pg_lease_up when a scrape fails

	up, keys, maxTTL, grace, timeline, period, scrape *prometheus.Desc
	held, epoch, holder, termAge, leaderless, ttl     *prometheus.Desc
	grants, recentTransitions, recentLeaderless       *prometheus.Desc
	historySince                                      *prometheus.Desc
	names                                             []string
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a collector that reads db (a *pgxpool.Pool is best: scrapes
// may overlap; a *pgx.Conn must not be used by anything else meanwhile).
// It fills the defaults of cfg and validates them once; an error names the
// field and matches lease.ErrInvalidInput.
func New(db lease.Querier, cfg Config) (*Collector, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: leasemetrics.New: nil Querier", lease.ErrInvalidInput)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := newDescs()
	c.db, c.c, c.cfg = db, lease.New(db), cfg
	return c, nil
}

// newDescs returns a Collector with its descriptions (and names) only.
func newDescs() *Collector {
	var names []string
	db1 := []string{"database"}
	key := []string{"database", "key"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		names = append(names, name)
		return prometheus.NewDesc(name, help, labels, nil)
	}
	c := &Collector{
		up:       d("pg_lease_up", "1 when the last scrape read pg_lease's state from the database, else 0.", db1),
		keys:     d("pg_lease_keys", "Keys in the database (rows of pg_lease's state, held or not).", db1),
		maxTTL:   d("pg_lease_max_ttl_seconds", "Largest ttl that acquire and renew accept (lease.configure).", db1),
		grace:    d("pg_lease_promotion_grace_remaining_seconds", "Seconds left of the grace after a timeline change (promotion) or a restart of the server during which no new grant is made; 0 when none is in force.", db1),
		timeline: d("pg_lease_timeline", "WAL timeline last seen by a grant (it grows at each promotion).", db1),
		period:   d("pg_lease_health_period_seconds", "Window of the pg_lease_key_recent_* metrics.", db1),
		scrape:   d("pg_lease_scrape_duration_seconds", "Duration of the scrape's queries.", db1),

		held:       d("pg_lease_key_held", "1 while the key is held by an unexpired grant, else 0.", key),
		epoch:      d("pg_lease_key_epoch", "Fencing epoch of the key: the current grant's, or the counter the next grant exceeds.", key),
		holder:     d("pg_lease_key_holder_info", "The current holder of a held key (owner string and database role); always 1.", []string{"database", "key", "holder", "role"}),
		termAge:    d("pg_lease_key_term_seconds", "Age of the current grant (term) of a held key; 0 when not held.", key),
		leaderless: d("pg_lease_key_leaderless_seconds", "How long the key has had no holder (since the last grant ended); 0 when held.", key),
		ttl:        d("pg_lease_key_ttl_seconds", "Duration (ttl) of the key's current or last grant, from its history; absent when none is recorded.", key),
		grants:     d("pg_lease_key_grants_total", "Grants (new terms) of the key recorded since its history began.", key),
		recentTransitions: d("pg_lease_key_recent_transitions",
			"Grants (new terms) of the key within the last pg_lease_health_period_seconds, from the history kept.", key),
		recentLeaderless: d("pg_lease_key_recent_leaderless_seconds",
			"Seconds within the last pg_lease_health_period_seconds during which the key had no holder, from the history kept.", key),
		historySince: d("pg_lease_key_history_oldest_timestamp_seconds",
			"Server time (Unix seconds) of the oldest event kept in the key's history.", key),
	}
	c.names = names
	return c
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

func (c *Collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.up, c.keys, c.maxTTL, c.grace, c.timeline, c.period, c.scrape,
		c.held, c.epoch, c.holder, c.termAge, c.leaderless, c.ttl, c.grants,
		c.recentTransitions, c.recentLeaderless, c.historySince}
}

// MetricNames returns the name of every metric the collector exports.
func MetricNames() []string {
	return newDescs().names
}

// Collect reads the database and sends the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	start := time.Now()
	db, st, keys, err := c.read(ctx)
	c.mu.Lock()
	if err == nil {
		c.database = db
	} else {
		db = c.database
	}
	c.mu.Unlock()
	if err != nil {
		if c.cfg.OnError != nil {
			c.cfg.OnError(err)
		}
		ch <- gauge(c.up, 0, db)
		return
	}
	ch <- gauge(c.up, 1, db)
	ch <- gauge(c.scrape, time.Since(start).Seconds(), db)
	ch <- gauge(c.keys, float64(len(keys)), db)
	ch <- gauge(c.maxTTL, st.maxTTL, db)
	ch <- gauge(c.grace, st.graceLeft, db)
	if st.timeline != nil {
		ch <- gauge(c.timeline, float64(*st.timeline), db)
	}
	ch <- gauge(c.period, c.cfg.Period.Seconds(), db)
	for _, k := range keys {
		ch <- gauge(c.held, b2f(k.Held), db, k.Key)
		ch <- gauge(c.epoch, float64(k.Epoch), db, k.Key)
		if k.Held {
			ch <- gauge(c.holder, 1, db, k.Key, k.Owner, k.Role)
		}
		ch <- gauge(c.termAge, k.TermAge.Seconds(), db, k.Key)
		ch <- gauge(c.leaderless, k.Vacant.Seconds(), db, k.Key)
		if k.TTL > 0 {
			ch <- gauge(c.ttl, k.TTL.Seconds(), db, k.Key)
		}
		if k.HasHistory {
			ch <- prometheus.MustNewConstMetric(c.grants, prometheus.CounterValue, float64(k.Grants), db, k.Key)
			ch <- gauge(c.historySince, float64(k.HistorySince.UnixMicro())/1e6, db, k.Key)
		}
		ch <- gauge(c.recentTransitions, float64(k.Transitions), db, k.Key)
		ch <- gauge(c.recentLeaderless, k.Leaderless.Seconds(), db, k.Key)
	}
}

type status struct {
	maxTTL, graceLeft float64
	timeline          *int64
}

func (c *Collector) read(ctx context.Context) (string, status, []leaseadmin.KeyHealth, error) {
	var (
		db string
		st status
	)
	err := c.db.QueryRow(ctx, `
SELECT current_database(), extract(epoch FROM s.max_ttl)::float8,
       greatest(0, coalesce(extract(epoch FROM s.grace_until - clock_timestamp()), 0))::float8, s.timeline
  FROM lease.status() s`).Scan(&db, &st.maxTTL, &st.graceLeft, &st.timeline)
	if err != nil {
		return "", status{}, nil, fmt.Errorf("leasemetrics: reading lease.status(): %w", err)
	}
	keys, err := leaseadmin.Health(ctx, c.c, c.cfg.Period)
	if err != nil {
		return "", status{}, nil, fmt.Errorf("leasemetrics: %w", err)
	}
	return db, st, keys, nil
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

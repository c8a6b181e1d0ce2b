// Package leasemetrics is a Prometheus collector of every key's leadership
// in one database, read from pg_lease itself (lease.health and
// lease.status): whether each key is held, its epoch, how long the term
// has lasted, how long a key has had no holder, how often leadership
// changed, and whether a promotion grace is in force. One scrape shows
// every controller's election, whichever process runs it.
//
// Embed it in any process that has a connection pool:
//
//	c, err := leasemetrics.New(pool, leasemetrics.Config{})
//	reg.MustRegister(c)
//
// or run `pglease serve-metrics`, which serves it. Each scrape runs two
// read-only queries, which take no lock on any key's row. To watch several
// databases from one registry, register one collector per database
// through prometheus.WrapRegistererWith with a label telling them apart.
//
// # What a scrape reveals, and how much
//
// Any role may create keys with names of its choosing, so the export is
// bounded and reveals no more than asked:
//
//   - At most Config.MaxKeys keys (default 1000), the first in byte order
//     of their names among those Config.KeyPrefixes selects (every key by
//     default); pg_lease_keys_omitted counts the selected keys left out.
//     A role that creates many keys can push others out of an unfiltered
//     export: select your own keys with KeyPrefixes.
//   - Label values are at most MaxLabelBytes (128) bytes of UTF-8: a key,
//     owner or role name that is longer, is not valid UTF-8, or looks like
//     a shortened value itself is exported as its first bytes, "…" and 16
//     hex digits of its SHA-256 (Label). Each key costs at most 11 series.
//   - Owner strings (pod and host names) and the holders' database roles
//     are exported only when asked (Config.ShowOwners, Config.ShowRoles:
//     pg_lease_key_holder_info), and the database label carries the
//     database's name only with Config.ShowDatabase (else it is empty).
//
// The alert rules and the Grafana dashboard in config/prometheus use these
// metrics; their tests check that every name they use is one Describe
// sends.
package leasemetrics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pg_lease/pkg/lease"
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
	// MaxKeys is how many keys a scrape exports at most: the first in byte
	// order of their names among the selected ones (default
	// DefaultMaxKeys; at most MaxMaxKeys). pg_lease_keys_omitted counts
	// the selected keys left out.
	MaxKeys int
	// KeyPrefixes, when set, selects the keys whose names start with one
	// of them (at most 100 prefixes of 1 to 1024 bytes); by default every
	// key is selected.
	KeyPrefixes []string
	// ShowOwners exports pg_lease_key_holder_info with each held key's
	// owner string (holder label). Default off: owner strings are often
	// pod and host names.
	ShowOwners bool
	// ShowRoles exports pg_lease_key_holder_info with the database role of
	// each held key's grant (role label). Default off.
	ShowRoles bool
	// ShowDatabase sets the database label to the database's name. Default
	// off: the label is empty (Prometheus then stores no such label).
	ShowDatabase bool
}

// Defaults and limits of Config.
const (
	DefaultPeriod  = time.Hour
	DefaultTimeout = 10 * time.Second
	DefaultMaxKeys = 1000
	MaxMaxKeys     = 100000
	// MaxLabelBytes bounds every label value the collector exports.
	MaxLabelBytes = 128
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
	switch {
	case c.MaxKeys == 0:
		c.MaxKeys = DefaultMaxKeys
	case c.MaxKeys < 0 || c.MaxKeys > MaxMaxKeys:
		return c, fmt.Errorf("%w: leasemetrics Config.MaxKeys %d: want 1 to %d", lease.ErrInvalidInput, c.MaxKeys, MaxMaxKeys)
	}
	if len(c.KeyPrefixes) > 100 {
		return c, fmt.Errorf("%w: leasemetrics Config.KeyPrefixes: %d prefixes, want at most 100", lease.ErrInvalidInput, len(c.KeyPrefixes))
	}
	for _, p := range c.KeyPrefixes {
		if p == "" || len(p) > 1024 || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
			return c, fmt.Errorf("%w: leasemetrics Config.KeyPrefixes: %q: want 1 to 1024 bytes of UTF-8 without NUL", lease.ErrInvalidInput, Label(p))
		}
	}
	c.KeyPrefixes = append([]string{}, c.KeyPrefixes...)
	return c, nil
}

// Collector is a prometheus.Collector of one database's keys.
type Collector struct {
	db  lease.Querier
	cfg Config

	mu       sync.Mutex
	database string // the last database label read, for pg_lease_up when a scrape fails

	up, keys, omitted, maxTTL, grace, timeline, period, scrape *prometheus.Desc
	held, epoch, holder, termAge, leaderless, ttl              *prometheus.Desc
	grants, recentTransitions, recentLeaderless                *prometheus.Desc
	historySince                                               *prometheus.Desc
	names                                                      []string
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
	c.db, c.cfg = db, cfg
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
		up:   d("pg_lease_up", "1 when the last scrape read pg_lease's state from the database, else 0.", db1),
		keys: d("pg_lease_keys", "Keys in the database (rows of pg_lease's state, held or not).", db1),
		omitted: d("pg_lease_keys_omitted",
			"Keys of the collector's selection (its key prefixes; every key by default) that this scrape left out: beyond its maximum number of keys.", db1),
		maxTTL:   d("pg_lease_max_ttl_seconds", "Largest ttl that acquire and renew accept (lease.configure).", db1),
		grace:    d("pg_lease_promotion_grace_remaining_seconds", "Seconds left of the grace after a timeline change (promotion) or a restart of the server during which no new grant is made; 0 when none is in force.", db1),
		timeline: d("pg_lease_timeline", "WAL timeline last seen by a grant (it grows at each promotion).", db1),
		period:   d("pg_lease_health_period_seconds", "Window of the pg_lease_key_recent_* metrics.", db1),
		scrape:   d("pg_lease_scrape_duration_seconds", "Duration of the scrape's queries.", db1),

		held:  d("pg_lease_key_held", "1 while the key is held by an unexpired grant, else 0.", key),
		epoch: d("pg_lease_key_epoch", "Fencing epoch of the key: the current grant's, or the counter the next grant exceeds.", key),
		holder: d("pg_lease_key_holder_info",
			"The current holder of a held key (owner string and database role, each only when the collector is asked to show it); always 1.",
			[]string{"database", "key", "holder", "role"}),
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
	return []*prometheus.Desc{c.up, c.keys, c.omitted, c.maxTTL, c.grace, c.timeline, c.period, c.scrape,
		c.held, c.epoch, c.holder, c.termAge, c.leaderless, c.ttl, c.grants,
		c.recentTransitions, c.recentLeaderless, c.historySince}
}

// MetricNames returns the name of every metric the collector exports.
func MetricNames() []string {
	return newDescs().names
}

// Check runs one scrape's queries and returns their error: one that matches
// lease.ErrNotInstalled when pg_lease (or its lease.health, 0.4.0 and
// later) is missing.
func (c *Collector) Check(ctx context.Context) error {
	_, err := c.read(ctx)
	return err
}

// Collect reads the database and sends the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	start := time.Now()
	sc, err := c.read(ctx)
	db := sc.database
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
	ch <- gauge(c.keys, float64(sc.total), db)
	ch <- gauge(c.omitted, float64(sc.selected-int64(len(sc.keys))), db)
	ch <- gauge(c.maxTTL, sc.maxTTL, db)
	ch <- gauge(c.grace, sc.graceLeft, db)
	if sc.timeline != nil {
		ch <- gauge(c.timeline, float64(*sc.timeline), db)
	}
	ch <- gauge(c.period, c.cfg.Period.Seconds(), db)
	for _, k := range sc.keys {
		key := Label(k.key)
		ch <- gauge(c.held, b2f(k.held), db, key)
		ch <- gauge(c.epoch, float64(k.epoch), db, key)
		if k.held && (c.cfg.ShowOwners || c.cfg.ShowRoles) {
			ch <- gauge(c.holder, 1, db, key, Label(k.owner), Label(k.role))
		}
		ch <- gauge(c.termAge, k.termAge.Seconds(), db, key)
		ch <- gauge(c.leaderless, k.vacant.Seconds(), db, key)
		if k.ttl > 0 {
			ch <- gauge(c.ttl, k.ttl, db, key)
		}
		if k.grants != nil {
			ch <- prometheus.MustNewConstMetric(c.grants, prometheus.CounterValue, float64(*k.grants), db, key)
			if k.historySince != nil {
				ch <- gauge(c.historySince, float64(k.historySince.UnixMicro())/1e6, db, key)
			}
		}
		ch <- gauge(c.recentTransitions, float64(k.transitions), db, key)
		ch <- gauge(c.recentLeaderless, k.leaderless, db, key)
	}
}

// scrape is what one scrape read.
type scrape struct {
	database          string // the database label: the name, or "" unless ShowDatabase
	maxTTL, graceLeft float64
	timeline          *int64
	total, selected   int64 // keys in the database, and those the selection chose
	keys              []keyRow
}

// keyRow is one exported key's health.
type keyRow struct {
	key, owner, role string // owner and role only when asked for
	held             bool
	epoch            int64
	termAge, vacant  time.Duration
	ttl, leaderless  float64
	grants           *int64
	transitions      int64
	historySince     *time.Time
}

// healthSQL reads the selected keys' health, at most $2 of them in byte
// order of their names, and how many keys the database has and the
// selection chose. Owner and role are read only when asked for ($4, $5).
// With no key selected it returns one row of counts alone.
const healthSQL = `
WITH h AS MATERIALIZED (
  SELECT h.*, (cardinality($3::text[]) = 0
               OR EXISTS (SELECT 1 FROM unnest($3::text[]) p(prefix) WHERE starts_with(h.key, p.prefix))) AS sel
    FROM lease.health(make_interval(secs => $1)) h),
n AS (SELECT count(*) AS total, count(*) FILTER (WHERE h.sel) AS selected FROM h)
SELECT n.total, n.selected, k.key, k.held, CASE WHEN $4 THEN k.owner END, CASE WHEN $5 THEN k.holder_role END,
       k.epoch, k.term_started, k.vacant_since, extract(epoch FROM k.ttl)::float8, k.grants, k.transitions,
       k.leaderless_seconds, k.history_since, k.observed_at
  FROM n LEFT JOIN LATERAL (SELECT * FROM h WHERE h.sel ORDER BY h.key COLLATE "C" LIMIT $2) k ON true
 ORDER BY k.key COLLATE "C"`

func (c *Collector) read(ctx context.Context) (scrape, error) {
	var sc scrape
	err := c.db.QueryRow(ctx, `
SELECT CASE WHEN $1 THEN current_database() ELSE '' END, extract(epoch FROM s.max_ttl)::float8,
       greatest(0, coalesce(extract(epoch FROM s.grace_until - clock_timestamp()), 0))::float8, s.timeline
  FROM lease.status() s`, c.cfg.ShowDatabase).Scan(&sc.database, &sc.maxTTL, &sc.graceLeft, &sc.timeline)
	if err != nil {
		return scrape{}, fmt.Errorf("leasemetrics: %w", lease.WrapError("status", "", err))
	}
	sc.database = Label(sc.database)
	prefixes := c.cfg.KeyPrefixes
	if prefixes == nil {
		prefixes = []string{}
	}
	rows, err := c.db.Query(ctx, healthSQL, c.cfg.Period.Seconds(), c.cfg.MaxKeys, prefixes, c.cfg.ShowOwners, c.cfg.ShowRoles)
	if err != nil {
		return scrape{}, fmt.Errorf("leasemetrics: %w", lease.WrapError("health", "", err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k                    keyRow
			key, owner, role     *string
			held                 *bool
			epoch, transitions   *int64
			started, vacant, now *time.Time
			ttl, leaderless      *float64
		)
		if err := rows.Scan(&sc.total, &sc.selected, &key, &held, &owner, &role, &epoch, &started, &vacant,
			&ttl, &k.grants, &transitions, &leaderless, &k.historySince, &now); err != nil {
			return scrape{}, fmt.Errorf("leasemetrics: %w", lease.WrapError("health", "", err))
		}
		if key == nil {
			continue // the counts alone: no key selected
		}
		k.key, k.owner, k.role = *key, deref(owner), deref(role)
		k.held, k.epoch, k.transitions = deref(held), deref(epoch), deref(transitions)
		k.ttl, k.leaderless = deref(ttl), deref(leaderless)
		if started != nil && now != nil {
			k.termAge = max(0, now.Sub(*started))
		}
		if vacant != nil && now != nil {
			k.vacant = max(0, now.Sub(*vacant))
		}
		sc.keys = append(sc.keys, k)
	}
	if err := rows.Err(); err != nil {
		return scrape{}, fmt.Errorf("leasemetrics: %w", lease.WrapError("health", "", err))
	}
	return sc, nil
}

// shortSuffixLen is the length of what Label appends: "…" and 16 hex
// digits.
const shortSuffixLen = len("…") + 16

// Label is the label value the collector exports for a key, owner or role
// name s: s itself when it is valid UTF-8 of at most MaxLabelBytes bytes
// and does not end the way a shortened value does; otherwise the longest
// valid UTF-8 start of s within 100 bytes, "…", and the first 16 hex
// digits of the SHA-256 of s. Distinct names get distinct labels (short of
// a SHA-256 collision on 64 bits), so one role cannot name a key so that
// its series replace another key's.
func Label(s string) string {
	if len(s) <= MaxLabelBytes && utf8.ValidString(s) && !looksShortened(s) {
		return s
	}
	n := 0
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if r == utf8.RuneError && size <= 1 || n+size > 100 {
			break
		}
		n += size
	}
	sum := sha256.Sum256([]byte(s))
	return s[:n] + "…" + hex.EncodeToString(sum[:8])
}

// looksShortened reports whether s ends like a value Label shortened.
func looksShortened(s string) bool {
	if len(s) < shortSuffixLen || !strings.HasPrefix(s[len(s)-shortSuffixLen:], "…") {
		return false
	}
	for _, r := range s[len(s)-16:] {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
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

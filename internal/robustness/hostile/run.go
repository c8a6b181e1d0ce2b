package hostile

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgserver"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Config is one run.
type Config struct {
	Seed     int64
	Duration time.Duration // how long the hostile roles act; default 30 s
	// HonestOnly runs the honest parts alone, for as long: the control
	// run, in which no check may fail either.
	HonestOnly bool
	Logf       func(format string, args ...any)
}

// The honest keys and identities. Owner strings are public (lease.list):
// the hostile roles are given them, as they could read them.
const (
	electorKey      = "team-a/leader"
	clientGoKey     = "team-b/leader"
	shardController = "team-c"
	shardCount      = 4
	handoverKey     = "team-d/leader"
)

var (
	probeKeys     = []string{"probe/0", "probe/1", "probe/2"}
	electorIDs    = []string{"pod-a", "pod-b", "pod-c"}
	clientGoIDs   = []string{"cg-a", "cg-b", "cg-c"}
	shardIDs      = []string{"shard-a", "shard-b", "shard-c"}
	handoverIDs   = []string{"ho-a", "ho-b"}
	probeOwner    = "probe"
	spoofable     = map[string][]string{electorKey: electorIDs, clientGoKey: clientGoIDs, handoverKey: handoverIDs}
	hostileRoles  = []string{"eve1", "eve2", "eve3", creatorRole}
	honestRoleSet = map[string]bool{roleElector: true, roleClientGo: true, roleShard: true, roleHandover: true, roleProbe: true}
)

// The roles. Each honest part of the product runs as a role of its own,
// with only what an application gets (CONNECT, and EXECUTE as installed);
// the hostile roles get the same, and one of them CREATE on the database.
const (
	roleElector  = "app_elector"
	roleClientGo = "app_clientgo"
	roleShard    = "app_shard"
	roleHandover = "app_handover"
	roleProbe    = "app_probe"
	creatorRole  = "mallory"
	database     = "tenants"
)

// isHonestKey reports whether k belongs to an honest part.
func isHonestKey(k string) bool {
	switch {
	case k == electorKey || k == clientGoKey || k == handoverKey:
		return true
	case strings.HasPrefix(k, shardController+"/"):
		return true
	}
	for _, p := range probeKeys {
		if k == p {
			return true
		}
	}
	return false
}

func isProbeKey(k string) bool {
	for _, p := range probeKeys {
		if k == p {
			return true
		}
	}
	return false
}

// honestKeys lists the keys the hostile roles aim at.
func honestKeys() []string {
	ks := []string{electorKey, clientGoKey, handoverKey, shardController + "/changed"}
	for s := range shardCount {
		ks = append(ks, fmt.Sprintf("%s/shard/%d", shardController, s))
	}
	for _, id := range shardIDs {
		ks = append(ks, shardController+"/member/"+id)
	}
	return append(ks, probeKeys...)
}

// env is what every part of a run shares.
type env struct {
	cfg   Config
	rec   *Recorder
	srv   *pgserver.Server
	admin *pgxpool.Pool // the installer (a superuser) on the database
	reg   *registry     // the hostile backends and their open transactions
	mon   *mon          // the installer's view, read throughout the run
	logf  func(format string, args ...any)

	handedMu sync.Mutex
	handed   map[string]bool // key/epoch of handovers already judged

	cgMu sync.Mutex
	cgs  []*cgCandidate
}

func (e *env) dsn(role string) string { return e.dsnOf(role, database) }

func (e *env) dsnOf(role, db string) string {
	return pgserver.WithUser(e.srv.DatabaseDSN(db), role)
}

// honestPool opens a pool of role for party, every statement counted
// against limit, set up as the README says an application's pool is.
func (e *env) honestPool(ctx context.Context, role, party string, limit float64, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.dsn(role))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = e.rec.Tracer(party, limit)
	lease.ObserveCommits(&cfg.ConnConfig.Config)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// judged reports whether the handover of key at epoch was judged already,
// and marks it.
func (e *env) judged(key string, epoch int64) bool {
	e.handedMu.Lock()
	defer e.handedMu.Unlock()
	id := fmt.Sprintf("%s@%d", key, epoch)
	if e.handed[id] {
		return true
	}
	e.handed[id] = true
	return false
}

// Run starts a throwaway server, installs pg_lease as a superuser, runs the
// honest parts and the hostile roles for cfg.Duration, stops them all, and
// checks what the honest parts observed. err is about the run itself (a
// server that did not start); the result holds the violations.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	rec := NewRecorder()
	e := &env{cfg: cfg, rec: rec, reg: newRegistry(), handed: map[string]bool{}}
	e.mon = newMon(e)
	e.logf = func(format string, args ...any) {
		cfg.Logf("%7.2fs "+format, append([]any{rec.Now().Seconds()}, args...)...)
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{
		"max_connections":  "250",
		"log_min_messages": "fatal",
		// pg_stat_activity's query text, for the messages of check (8).
		"track_activity_query_size": "4096",
	}})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	e.srv = srv
	if err := e.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	acfg, err := pgxpool.ParseConfig(srv.DatabaseDSN(database))
	if err != nil {
		return nil, err
	}
	// The harness's own reads run with search_path pinned: the creator
	// role takes the installer's "$user" schema.
	acfg.ConnConfig.RuntimeParams["search_path"] = "pg_catalog"
	admin, err := pgxpool.NewWithConfig(ctx, acfg)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	e.admin = admin

	rnd := rand.New(rand.NewSource(cfg.Seed))
	seed := func() int64 { return rnd.Int63() }

	// Honest parts first, the hostile roles with them; the monitor reads
	// the installer's view throughout.
	honestCtx, stopHonest := context.WithCancel(ctx)
	defer stopHonest()
	monCtx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	hostileCtx, stopHostile := context.WithTimeout(ctx, cfg.Duration)
	defer stopHostile()

	var honest, hostile, mon sync.WaitGroup
	start := func(wg *sync.WaitGroup, name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				e.logf("%s: %v", name, err)
				rec.Count("errors: "+name, 1)
			}
		}()
	}
	mon.Add(1)
	go func() { defer mon.Done(); e.monitor(monCtx) }()
	for _, id := range electorIDs {
		s := seed()
		start(&honest, "elector "+id, func() error { return e.runElector(honestCtx, id, s) })
	}
	for _, id := range clientGoIDs {
		s := seed()
		start(&honest, "client-go "+id, func() error { return e.runClientGo(honestCtx, id, s) })
	}
	for _, id := range shardIDs {
		s := seed()
		start(&honest, "shard "+id, func() error { return e.runShard(honestCtx, id, s) })
	}
	for _, id := range handoverIDs {
		s := seed()
		start(&honest, "handover "+id, func() error { return e.runHandover(honestCtx, id, s) })
	}
	for _, k := range probeKeys {
		s := seed()
		start(&honest, "probe "+k, func() error { return e.runProbe(honestCtx, k, s) })
	}
	if !cfg.HonestOnly {
		for _, a := range e.attackers(seed) {
			start(&hostile, "hostile "+a.name, func() error { return a.run(hostileCtx) })
		}
		s := seed()
		start(&hostile, "squatting", func() error { return e.runSquats(hostileCtx, s) })
	}

	// The hostile roles stop at the end of the duration, and end their
	// transactions; then the honest parts stop (releasing what they hold).
	<-hostileCtx.Done()
	if !waitBounded(&hostile, 30*time.Second) {
		rec.Count("errors: hostile roles did not stop within 30s", 1)
	}
	e.logf("hostile roles stopped; stopping the honest parts")
	stopHonest()
	if !waitBounded(&honest, 45*time.Second) {
		rec.Count("errors: honest parts did not stop within 45s", 1)
	}
	stopMonitor()
	mon.Wait()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	e.finalChecks(fctx)
	return Check(cfg.Seed, cfg.Duration, rec.Data()), nil
}

// waitBounded waits for wg at most d.
func waitBounded(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// setup makes the database, installs pg_lease there as the superuser (the
// installer), and creates the roles.
func (e *env) setup(ctx context.Context) error {
	if err := e.srv.InstallExtensionFiles(ctx); err != nil {
		return err
	}
	if _, err := e.srv.CreateDatabase(ctx, database); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, e.srv.DatabaseDSN(database))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE EXTENSION pg_lease`); err != nil {
		return err
	}
	roles := append([]string{roleElector, roleClientGo, roleShard, roleHandover, roleProbe}, hostileRoles...)
	for _, r := range roles {
		if err := e.srv.CreateRole(ctx, r, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"); err != nil {
			return err
		}
	}
	_, err = conn.Exec(ctx, `GRANT CREATE ON DATABASE `+database+` TO `+creatorRole)
	return err
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// between is a random duration in [lo, hi).
func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int63n(int64(hi-lo)))
}

package leaderelection_test

import (
	"context"
	"errors"
	goflag "flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/internal/pgtest"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The --leader-elect* flags are component-base's own: every flag
// options.BindLeaderElectionFlags defines is there with its name, and they
// fill the LeaderElectionConfiguration.
func TestBindFlagsStdlib(t *testing.T) {
	fs := goflag.NewFlagSet("x", goflag.ContinueOnError)
	f := pgle.BindFlags(fs)
	err := fs.Parse([]string{"-leader-elect", "--leader-elect-resource-lock=pglease",
		"--leader-elect-resource-name=op", "--leader-elect-resource-namespace", "ns",
		"--leader-elect-lease-duration=20s", "--leader-elect-renew-deadline=12s", "--leader-elect-retry-period=3s",
		"--leader-elect-dsn-file=/run/secrets/dsn"})
	if err != nil {
		t.Fatal(err)
	}
	c := f.Config
	if !c.LeaderElect || c.ResourceLock != "pglease" || c.ResourceName != "op" || c.ResourceNamespace != "ns" ||
		c.LeaseDuration.Duration != 20*time.Second || c.RenewDeadline.Duration != 12*time.Second ||
		c.RetryPeriod.Duration != 3*time.Second || c.DSNFile != "/run/secrets/dsn" || c.DSNEnv != pgle.DefaultDSNEnv {
		t.Fatalf("config %+v", c)
	}
	if pgle.PgLeaseKey(&c) != "ns/op" {
		t.Errorf("key %q, want ns/op", pgle.PgLeaseKey(&c))
	}
	if !pgle.IsSet(f, "leader-elect-lease-duration") || pgle.IsSet(f, "leader-elect-pglease-key") {
		t.Errorf("IsSet wrong")
	}
	if err := pgle.Validate(&c, field.NewPath("leaderElection")); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// A pflag (cobra) program: BindFlags on a standard flag set, added to the
// pflag set.
func TestBindPFlags(t *testing.T) {
	gofs := goflag.NewFlagSet("x", goflag.ContinueOnError)
	f := pgle.BindFlags(gofs)
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.AddGoFlagSet(gofs)
	if err := fs.Parse([]string{"--leader-elect", "--leader-elect-resource-lock", "leases+pglease", "--leader-elect-dsn-env=MY_DSN"}); err != nil {
		t.Fatal(err)
	}
	if !f.Config.LeaderElect || f.Config.ResourceLock != pgle.ResourceLockMigration || f.Config.DSNEnv != "MY_DSN" {
		t.Fatalf("config %+v", f.Config)
	}
}

// A kubebuilder scaffold defines -leader-elect itself; BindFlags leaves it
// alone and Flags.NewManager takes the value from the manager's options.
func TestScaffoldLeaderElectFlag(t *testing.T) {
	fs := goflag.NewFlagSet("x", goflag.ContinueOnError)
	var enable bool
	fs.BoolVar(&enable, "leader-elect", false, "scaffold's")
	f := pgle.BindFlags(fs)
	if err := fs.Parse([]string{"-leader-elect", "-leader-elect-resource-lock=pglease", "-leader-elect-retry-period=1s"}); err != nil {
		t.Fatal(err)
	}
	d := 5 * time.Second
	rp := 4 * time.Second
	c := pgle.MergedConfig(f, manager.Options{LeaderElection: enable, LeaderElectionID: "abc.example.com",
		LeaderElectionNamespace: "ops", RenewDeadline: &d, RetryPeriod: &rp})
	if !c.LeaderElect || c.ResourceName != "abc.example.com" || c.ResourceNamespace != "ops" || c.ResourceLock != "pglease" {
		t.Fatalf("config %+v", c)
	}
	// The option fills what no flag set; a flag given wins over the option.
	if c.RenewDeadline.Duration != d || c.RetryPeriod.Duration != time.Second || c.LeaseDuration.Duration != pgle.DefaultLeaseDuration {
		t.Fatalf("timings %v %v %v", c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
	}
	c = pgle.MergedConfig(f, manager.Options{LeaderElection: false})
	if c.LeaderElect {
		t.Fatal("LeaderElect taken from the flag Flags did not bind")
	}
}

func TestDecode(t *testing.T) {
	c, err := pgle.Decode([]byte("leaderElect: true\nresourceLock: pglease\nresourceName: op\nresourceNamespace: ns\nleaseDuration: 30s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.LeaderElect || c.ResourceLock != "pglease" || c.LeaseDuration.Duration != 30*time.Second ||
		c.RenewDeadline.Duration != pgle.DefaultRenewDeadline || c.RetryPeriod.Duration != pgle.DefaultRetryPeriod {
		t.Fatalf("decoded %+v", c)
	}
	c, err = pgle.Decode([]byte("resourceName: op\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.LeaderElect || c.ResourceLock != "leases" {
		t.Fatalf("defaults: %+v (want component-base's leaderElect true, and leases)", c)
	}
	if _, err := pgle.Decode([]byte("resourceLok: pglease\n")); !errors.Is(err, pgle.ErrInvalidConfig) || !strings.Contains(err.Error(), "resourceLok") {
		t.Fatalf("unknown field: %v", err)
	}
}

// Every invalid setting is reported with its field path: component-base's
// rules, the lock name and the handover by the configuration's own check,
// the timings against the TTL of a pg_lease lock by NewResourceLock (the
// lock's rule, resourcelock.New's).
func TestValidateNamesFields(t *testing.T) {
	t.Setenv("FIELDS_DSN", pgtest.NewLeaseDatabase(t))
	base := func() pgle.Config {
		c := pgle.DefaultConfig()
		c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
		c.DSNEnv = "FIELDS_DSN"
		return c
	}
	for _, tc := range []struct {
		name string
		mod  func(*pgle.Config)
		lock bool // found by NewResourceLock, not by the configuration's check
		want []string
	}{
		{"renew deadline + retry past the TTL", func(c *pgle.Config) { c.RenewDeadline.Duration = 13 * time.Second }, true,
			[]string{"leaderElection.renewDeadline", "RenewDeadline (13s) + RetryPeriod (2s) = 15s must be below", "lease duration (15s) minus its margin"}},
		{"lease duration not above renew deadline", func(c *pgle.Config) { c.LeaseDuration.Duration = 5 * time.Second }, false,
			[]string{"leaderElection.leaseDuration", "must be greater than `RenewDeadline`"}},
		{"retry jitter", func(c *pgle.Config) { c.RetryPeriod.Duration = 9 * time.Second; c.LeaseDuration.Duration = time.Minute }, true,
			[]string{"leaderElection.renewDeadline", "JitterFactor"}},
		{"ttl below 3ms", func(c *pgle.Config) {
			c.LeaseDuration.Duration, c.RenewDeadline.Duration, c.RetryPeriod.Duration = 2*time.Millisecond, time.Millisecond, 100*time.Microsecond
		}, true, []string{"leaderElection.leaseDuration", `"2ms"`, "ttl must be at least 3ms"}},
		{"unknown lock", func(c *pgle.Config) { c.ResourceLock = "endpoints" }, false,
			[]string{"leaderElection.resourceLock", `"endpoints"`, "pglease"}},
		{"no name", func(c *pgle.Config) { c.ResourceName = "" }, false, []string{"leaderElection.resourceName: Required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mod(&c)
			err := pgle.Validate(&c, field.NewPath("leaderElection"))
			if tc.lock {
				if err != nil {
					t.Fatalf("Validate: %v, want the lock to find it", err)
				}
				var l *pgle.ResourceLock
				if l, err = pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{}); err == nil {
					l.Close()
				}
			}
			if !errors.Is(err, pgle.ErrInvalidConfig) {
				t.Fatalf("error %v, want ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// The same timings are fine for client-go's own lock, which has no
	// server TTL: only client-go's rules apply.
	c := base()
	c.ResourceLock = "leases"
	c.RenewDeadline.Duration = 13 * time.Second
	if err := pgle.Validate(&c, field.NewPath("leaderElection")); err != nil {
		t.Errorf("leases: %v", err)
	}
	if _, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{KubeConfig: &rest.Config{Host: "http://127.0.0.1:1"}}); err != nil {
		t.Errorf("leases lock: %v", err)
	}
}

const secret = "s3cr3t-Pa55"

// DSN errors name the source, never the DSN.
func TestReadDSN(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "dsn")
	if err := os.WriteFile(file, []byte("  postgres://u:"+secret+"@h/db \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := pgle.ReadDSN(pgle.Config{DSNFile: file, DSNEnv: "NOPE"})
	if err != nil || got != "postgres://u:"+secret+"@h/db" {
		t.Fatalf("file: %q %v", got, err)
	}
	t.Setenv("TEST_DSN", "postgres://u:"+secret+"@h/db")
	if got, err := pgle.ReadDSN(pgle.Config{DSNEnv: "TEST_DSN"}); err != nil || !strings.Contains(got, secret) {
		t.Fatalf("env: %q %v", got, err)
	}
	t.Setenv(pgle.DefaultDSNEnv, "")
	if _, err := pgle.ReadDSN(pgle.Config{}); !errors.Is(err, pgle.ErrInvalidConfig) || !strings.Contains(err.Error(), "$PGLEASE_DSN") {
		t.Fatalf("empty default env: %v", err)
	}
	if _, err := pgle.ReadDSN(pgle.Config{DSNFile: filepath.Join(dir, "missing")}); !errors.Is(err, pgle.ErrInvalidConfig) {
		t.Fatalf("missing file: %v", err)
	}
	// A DSN that does not parse: NewResourceLock's error does not quote it.
	t.Setenv("BAD_DSN", "postgres://u:"+secret+"@h:notaport/db")
	c := pgle.DefaultConfig()
	c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
	c.DSNEnv = "BAD_DSN"
	_, err = pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{})
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "$BAD_DSN") {
		t.Fatalf("bad DSN: %v", err)
	}
}

// NewResourceLock("pglease") returns a pg_lease lock that client-go's own
// elector runs against real PostgreSQL: it leads under epoch 1 on the key
// ns/name. ResourceLockOptions.LockOptions reach the lock (its
// OnEpochChange is called), under what NewResourceLock derives (its
// LeaseDuration is not the TTL).
func TestNewPgLeaseRunsWithClientGo(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	t.Setenv("TEST_LEASE_DSN", dsn)
	c := pgle.DefaultConfig()
	c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
	c.LeaseDuration.Duration, c.RenewDeadline.Duration, c.RetryPeriod.Duration = 3*time.Second, 2*time.Second, 200*time.Millisecond
	c.DSNEnv = "TEST_LEASE_DSN"
	c.Identity = "me"
	started := make(chan lease.Token, 10)
	lock, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{LockOptions: resourcelock.Config{
		LeaseDuration: time.Hour, // NewResourceLock's own (leaseDuration) wins
		OnEpochChange: func(_, new lease.Token) {
			if new.Epoch != 0 {
				started <- new
			}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if lock.Lock == nil || lock.Lock.Key() != "ns/op" || lock.Identity() != "me" {
		t.Fatalf("lock %+v", lock)
	}
	// The lock's TTL is leaseDuration (it fills a zero LeaseDuration with it).
	if lc, _ := lock.Lock.LeaderElectionConfig(leaderelection.LeaderElectionConfig{}); lc.LeaseDuration != 3*time.Second {
		t.Fatalf("pg_lease lock's lease duration %v, want 3s", lc.LeaseDuration)
	}
	if _, ok := lock.Interface.(*resourcelock.Lock); !ok {
		t.Fatalf("pglease built %T", lock.Interface)
	}
	ctx, cancel := context.WithCancel(context.Background())
	led := make(chan lease.Token, 1)
	ld, rd, rp := lock.Config.LeaseDuration.Duration, lock.Config.RenewDeadline.Duration, lock.Config.RetryPeriod.Duration
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: ld, RenewDeadline: rd, RetryPeriod: rp, ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				tok, _ := lock.Lock.Token()
				led <- tok
			},
			OnStoppedLeading: func() {},
		}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	tok := <-led
	if tok.Key != "ns/op" || tok.Owner != "me" || tok.Epoch != 1 {
		t.Fatalf("token %v", tok)
	}
	select {
	case s := <-started:
		if s != tok {
			t.Fatalf("OnEpochChange started %v, the elector leads under %v", s, tok)
		}
	default:
		t.Fatal("ResourceLockOptions.LockOptions.OnEpochChange was not called for the term")
	}
	cancel()
	<-done
	// ReleaseOnCancel freed the key.
	pool := newPool(t, dsn)
	s, err := lease.New(pool).Inspect(context.Background(), "ns/op")
	if err != nil || s.Held {
		t.Fatalf("after release: %+v %v", s, err)
	}
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

// Flags.NewManager with pglease: the manager carries the pg_lease lock, and
// Fenced refuses to reconcile before the lock holds a term; with leases
// there is no pg_lease lock and Fenced returns the reconciler unchanged.
func TestNewManagerFenced(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	t.Setenv("FENCED_DSN", dsn)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unused := &rest.Config{Host: "http://" + l.Addr().String()} // never contacted: the manager is not started
	l.Close()
	inner := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })

	fs := goflag.NewFlagSet("x", goflag.ContinueOnError)
	f := pgle.BindFlags(fs)
	if err := fs.Parse([]string{"-leader-elect", "-leader-elect-resource-lock=pglease", "-leader-elect-resource-namespace=ns",
		"-leader-elect-dsn-env=FENCED_DSN"}); err != nil {
		t.Fatal(err)
	}
	mgr, err := f.NewManager(unused, manager.Options{LeaderElectionID: "op", Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	pg := pgle.LockOf(mgr)
	if pg == nil || pg.Key() != "ns/op" {
		t.Fatalf("LockOf = %v", pg)
	}
	if _, err := pgle.Fenced(pgle.LockOf(mgr), reconcile.TypedReconciler[reconcile.Request](inner)).Reconcile(context.Background(), reconcile.Request{}); !errors.Is(err, resourcelock.ErrNotHolding) {
		t.Fatalf("fenced reconcile without a term: %v, want ErrNotHolding", err)
	}
	// Start closes the lock's pool when it returns (here at once).
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = mgr.Start(done)

	fs = goflag.NewFlagSet("y", goflag.ContinueOnError)
	f = pgle.BindFlags(fs)
	if err := fs.Parse([]string{"-leader-elect", "-leader-elect-resource-namespace=ns"}); err != nil {
		t.Fatal(err)
	}
	mgr, err = f.NewManager(unused, manager.Options{LeaderElectionID: "op", Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if pgle.LockOf(mgr) != nil {
		t.Fatal("a leases manager has a pg_lease lock")
	}
	if _, err := pgle.Fenced(pgle.LockOf(mgr), reconcile.TypedReconciler[reconcile.Request](inner)).Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatalf("leases: %v", err)
	}
}

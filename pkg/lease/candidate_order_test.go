package lease_test

import (
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestCandidateBatchesLockInByteOrder: RegisterCandidates,
// WithdrawCandidates and SetStrategies take their keys in byte order
// whatever order they are given, so two transactions of one role whose key
// sets overlap wait for each other at most once. One transaction holds the
// row of "a" (a call with that key alone); the other is given "b", "a" and
// waits for "a"; the first then asks for "b". Taken in the given order the
// second held "b" while it waited, and the two deadlocked (40P01). The
// registrations are refreshed and withdrawn under one owner (their rows
// are per key and owner); the strategies are changed on pg_lease 0.4.0
// (whose set_strategy locks an existing strategy row alone) and on this
// version.
func TestCandidateBatchesLockInByteOrder(t *testing.T) {
	cand := lease.Candidate{Owner: "o", TTL: never, Ready: true}
	register := func(c *lease.Client, keys []string) error {
		refused, err := c.RegisterCandidates(testCtx(t), keys, make([]int32, len(keys)), cand)
		if err == nil && len(refused) > 0 {
			t.Errorf("RegisterCandidates(%q) refused %q", keys, refused)
		}
		return err
	}
	withdraw := func(c *lease.Client, keys []string) error {
		return c.WithdrawCandidates(testCtx(t), keys, cand.Owner)
	}
	setStrategies := func(s lease.Strategy) func(c *lease.Client, keys []string) error {
		return func(c *lease.Client, keys []string) error { return c.SetStrategies(testCtx(t), keys, s) }
	}
	for _, tc := range []struct {
		name    string
		version string // "": this version
		prepare func(c *lease.Client, keys []string) error
		call    func(c *lease.Client, keys []string) error
	}{
		{"RegisterCandidates", "", register, register},
		{"WithdrawCandidates", "", register, withdraw},
		{"SetStrategies", "", setStrategies(lease.StrategyPriority), setStrategies(lease.StrategyNewestVersion)},
		{"SetStrategies on 0.4.0", "0.4.0", setStrategies(lease.StrategyPriority), setStrategies(lease.StrategyNewestVersion)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			var dsn string
			if tc.version == "" {
				dsn = installModes[0].NewDatabase(t)
			} else {
				pgtest.SharedExtensionFiles(t)
				dsn = pgtest.NewDatabase(t)
				if _, err := connect(t, dsn).Exec(ctx, `CREATE EXTENSION pg_lease VERSION '`+tc.version+`'`); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.prepare(lease.New(newPool(t, dsn)), []string{"a", "b"}); err != nil {
				t.Fatal(err)
			}
			conn1, conn2 := connect(t, dsn), connect(t, dsn)
			var pid2 int32
			if err := conn2.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid2); err != nil {
				t.Fatal(err)
			}
			tx1, err := conn1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx1.Rollback(ctx) }()
			tx2, err := conn2.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx2.Rollback(ctx) }()
			c1, c2 := lease.New(tx1), lease.New(tx2)

			if err := tc.call(c1, []string{"a"}); err != nil {
				t.Fatal(err)
			}
			second := make(chan error, 1)
			go func() {
				err := tc.call(c2, []string{"b", "a"})
				if err == nil {
					err = tx2.Commit(ctx)
				}
				second <- err
			}()
			waits := newPool(t, dsn)
			pgtest.Eventually(t, time.Minute, "the second transaction to wait for a lock", func() bool {
				var n int
				err := waits.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`,
					pid2).Scan(&n)
				return err == nil && n == 1
			})
			if err := tc.call(c1, []string{"b"}); err != nil {
				t.Errorf("the first transaction's call for b: %v", err)
			} else if err := tx1.Commit(ctx); err != nil {
				t.Errorf("the first transaction's commit: %v", err)
			}
			if err := <-second; err != nil {
				t.Errorf("the call for b, a: %v", err)
			}
		})
	}
}

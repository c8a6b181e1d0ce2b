package handover_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// The candidate calls map the server's answers to the package's sentinel
// errors, and a handover grant is the candidate's own: its Acquire answers
// it (idempotent), and it renews it.
func TestCandidatesAndHandover(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		if prev, err := handover.SetStrategy(ctx, c, "k", handover.StrategyPriority); err != nil || prev != handover.StrategyAny {
			t.Fatalf("SetStrategy: %v %v", prev, err)
		}
		g, ok, err := c.Acquire(ctx, "k", "leader", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		// A registration on a connection of its own: it ends with it.
		goneConn := connect(t, db.dsn)
		gone := lease.New(goneConn)
		if _, err := handover.Register(ctx, gone, "k", handover.Candidate{Owner: "gone", Priority: 9, Ready: true, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		exp, err := handover.Register(ctx, c, "k", handover.Candidate{Owner: "next", Version: "1.2.3", Priority: 1, Ready: true, TTL: 30 * time.Second})
		if err != nil || exp.IsZero() {
			t.Fatalf("Register: %v %v", exp, err)
		}
		if _, err := handover.Register(ctx, c, "k", handover.Candidate{Owner: "idle", Ready: false, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		st, cs, err := handover.Candidates(ctx, c, "k")
		if err != nil || st != handover.StrategyPriority || len(cs) != 3 || cs[0].Owner != "gone" || cs[0].Rank != 1 ||
			cs[1].Owner != "next" || cs[1].Version != "1.2.3" || cs[2].Rank != 0 {
			t.Fatalf("Candidates: %v %+v %v", st, cs, err)
		}
		if err := goneConn.Close(ctx); err != nil {
			t.Fatal(err)
		}
		pgtest.Eventually(t, time.Minute, "the closed connection's candidate to be gone", func() bool {
			_, cs, err := handover.Candidates(ctx, c, "k")
			if err != nil {
				t.Fatal(err)
			}
			return len(cs) == 3 && cs[0].Owner == "next" && cs[0].Rank == 1 && cs[1].Owner == "gone" && !cs[1].Live && cs[1].Rank == 0
		})

		if err := c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		s, err := c.Inspect(ctx, "k")
		if err != nil || !s.Held || s.Owner != "next" || s.Epoch != g.Epoch+1 {
			t.Fatalf("after the release: %+v %v, want next at epoch %d", s, err, g.Epoch+1)
		}
		h, ok, err := c.Acquire(ctx, "k", "next", time.Minute)
		if err != nil || !ok || h.Epoch != s.Epoch || !h.ExpiresAt.Equal(s.ExpiresAt) {
			t.Fatalf("the candidate's acquire: %+v %v %v, want the handed grant", h, ok, err)
		}
		if _, err := c.Renew(ctx, h.Token, time.Minute); err != nil {
			t.Fatal(err)
		}

		if ok, err := handover.Withdraw(ctx, c, "k", "idle"); err != nil || !ok {
			t.Fatalf("Withdraw: %v %v", ok, err)
		}
		if ok, err := handover.Withdraw(ctx, c, "k", "idle"); err != nil || ok {
			t.Fatalf("second Withdraw: %v %v", ok, err)
		}
		_, err = handover.Register(ctx, c, "k", handover.Candidate{Owner: "bad", Version: "one", Ready: true, TTL: time.Minute})
		var pg *pgconn.PgError
		if !errors.Is(err, lease.ErrInvalidInput) || !errors.As(err, &pg) || pg.Detail == "" {
			t.Fatalf("bad version: %v", err)
		}
		if _, err := handover.SetStrategy(ctx, c, "k", "fastest"); !errors.Is(err, lease.ErrInvalidInput) {
			t.Fatalf("bad strategy: %v", err)
		}
		if _, err := handover.ParseStrategy("newest-version"); err != nil {
			t.Fatal(err)
		}
		if _, err := handover.ParseStrategy("fastest"); !errors.Is(err, lease.ErrInvalidInput) {
			t.Fatalf("ParseStrategy: %v", err)
		}
		// The bound on a role's registrations is ErrTooMany.
		if _, err := db.pool.Exec(ctx, `INSERT INTO lease.candidates (key, owner, role, pid, priority, ready, ttl, registered_at, expires_at)
			SELECT 'many', 'c' || i, session_user, pg_backend_pid(), 0, true, '1 min', clock_timestamp(), clock_timestamp() + interval '1 min'
			  FROM generate_series(1, 8192) i`); err != nil {
			t.Fatal(err)
		}
		if _, err := handover.Register(ctx, c, "many", handover.Candidate{Owner: "more", Ready: true, TTL: time.Minute}); !errors.Is(err, handover.ErrTooMany) {
			t.Fatalf("registration beyond the bound: %v", err)
		}
	})
}

// RegisterMany registers one owner on many keys with their own priorities
// in one statement; a release of each key hands it to the highest;
// WithdrawMany ends the registrations and SetStrategyMany sets strategies.
func TestRegisterMany(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		keys := []string{"m1", "m2"}
		if err := handover.SetStrategyMany(ctx, c, keys, handover.StrategyPriority); err != nil {
			t.Fatal(err)
		}
		cand := handover.Candidate{Owner: "x", Ready: true, TTL: time.Minute}
		if refused, err := handover.RegisterMany(ctx, c, keys, []int32{2, 1}, cand); err != nil || len(refused) != 0 {
			t.Fatalf("RegisterMany: %v %v", refused, err)
		}
		cand.Owner = "y"
		if _, err := handover.RegisterMany(ctx, c, keys, []int32{1, 2}, cand); err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"x", "y"} {
			g, ok, err := c.Acquire(ctx, keys[i], "holder", time.Minute)
			if err != nil || !ok {
				t.Fatalf("acquire %s: %v %v", keys[i], ok, err)
			}
			if err := c.Release(ctx, g.Token); err != nil {
				t.Fatal(err)
			}
			st, err := c.Inspect(ctx, keys[i])
			if err != nil || !st.Held || st.Owner != want {
				t.Errorf("%s after the release: %+v %v, want handed to %s", keys[i], st, err, want)
			}
		}
		if err := handover.WithdrawMany(ctx, c, keys, "y"); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			_, cands, err := handover.Candidates(ctx, c, k)
			if err != nil || len(cands) != 1 || cands[0].Owner != "x" {
				t.Errorf("%s after y withdrew: %+v %v", k, cands, err)
			}
		}
		if _, err := handover.RegisterMany(ctx, c, keys, []int32{1}, cand); !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("two keys, one priority: %v, want ErrInvalidInput", err)
		}
	})
}

// CheckVersion applies the server's rule: for each input, it refuses
// exactly what lease._version_violation refuses.
func TestCheckVersionAgreesWithServer(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	for _, v := range []string{
		"", "1", "1.2", "1.2.3", "v1.31.0", "V2.0.0-rc.1", "1.2.3-alpha.1+build.5", " 1.2.3 ", "1.2-rc.1",
		"1.2.3.4", "x1.2", "1..2", "1.2.3-", "1.2.3+", "-1.2", "1.2.3-α", "1.2.3 beta", "v",
		strings.Repeat("1", 31), "1." + strings.Repeat("0", 30), "1.0.0-" + strings.Repeat("a", 250),
		"1.0.0-" + strings.Repeat("a", 251),
	} {
		var violation *string
		if err := db.pool.QueryRow(ctx, `SELECT lease._version_violation($1)`, v).Scan(&violation); err != nil {
			t.Fatal(err)
		}
		server := violation != nil && v != ""
		err := handover.CheckVersion(v)
		if err != nil && !errors.Is(err, lease.ErrInvalidInput) {
			t.Errorf("CheckVersion(%q): %v, want ErrInvalidInput", v, err)
		}
		if (err != nil) != server {
			t.Errorf("CheckVersion(%q) = %v; the server's violation: %v", v, err, deref(violation))
		}
	}
	if err := (handover.Candidacy{Strategy: "fastest"}).Check(); !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("Candidacy with strategy fastest: %v", err)
	}
	if err := (handover.Candidacy{Strategy: handover.StrategyNewestVersion, Version: "1.2.3"}).Check(); err != nil {
		t.Errorf("valid Candidacy: %v", err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}

// Another database role's candidates and strategies never decide where a
// role's release goes: eve sets the key's strategy first, registers a
// candidate at the highest priority and takes the owner string of alice's
// follower first; alice sets her own strategy, registers that follower all
// the same, and her release hands the key to it, bound to her role. Eve's
// candidate may acquire the key once a release frees it, like anyone.
func TestAnotherRoleDecidesNoHandover(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		_, aliceDSN := pgtest.NewRole(t, db.dsn, "regress_pglease_alice")
		_, eveDSN := pgtest.NewRole(t, db.dsn, "regress_pglease_eve")
		alice := lease.New(pgtest.NewPool(t, aliceDSN))
		eve := lease.New(pgtest.NewPool(t, eveDSN))

		if _, err := handover.SetStrategy(ctx, eve, "leader", handover.StrategyNewestVersion); err != nil {
			t.Fatal(err)
		}
		for _, cand := range []handover.Candidate{
			{Owner: "eve", Version: "99.0.0", Priority: 1<<31 - 1, Ready: true, TTL: time.Minute},
			{Owner: "alice-next", Version: "99.0.0", Priority: 1<<31 - 1, Ready: true, TTL: time.Minute},
		} {
			if _, err := handover.Register(ctx, eve, "leader", cand); err != nil {
				t.Fatal(err)
			}
		}
		prev, err := handover.SetStrategy(ctx, alice, "leader", handover.StrategyPriority)
		if err != nil || prev != handover.StrategyAny {
			t.Fatalf("alice's SetStrategy after eve's: %v %v, want any and no error", prev, err)
		}
		g, ok, err := alice.Acquire(ctx, "leader", "alice", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		if _, err := handover.Register(ctx, alice, "leader", handover.Candidate{Owner: "alice-next", Priority: 10, Ready: true, TTL: time.Minute}); err != nil {
			t.Fatalf("alice's registration of an owner string eve registered first: %v", err)
		}
		st, cs, err := handover.Candidates(ctx, alice, "leader")
		if err != nil || st != handover.StrategyPriority || len(cs) != 3 || cs[0].Owner != "alice-next" || cs[0].Rank != 1 ||
			cs[1].Rank != 0 || cs[2].Rank != 0 {
			t.Fatalf("alice's Candidates: %v %+v %v, want her strategy and only her candidate ranked", st, cs, err)
		}
		if st, _, err := handover.Candidates(ctx, eve, "leader"); err != nil || st != handover.StrategyNewestVersion {
			t.Fatalf("eve's strategy: %v %v, want hers unchanged", st, err)
		}
		if err := alice.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		s, err := alice.Inspect(ctx, "leader")
		if err != nil || !s.Held || s.Owner != "alice-next" || s.Epoch != g.Epoch+1 {
			t.Fatalf("after alice's release: %+v %v, want alice-next at epoch %d", s, err, g.Epoch+1)
		}
		h, ok, err := alice.Acquire(ctx, "leader", "alice-next", time.Minute)
		if err != nil || !ok || h.Epoch != s.Epoch {
			t.Fatalf("alice-next takes up the grant: %+v %v %v", h, ok, err)
		}
		// Without a candidate of hers, alice's release frees the key, and
		// eve's candidate acquires it like anyone.
		if ok, err := handover.Withdraw(ctx, alice, "leader", "alice-next"); err != nil || !ok {
			t.Fatalf("Withdraw: %v %v", ok, err)
		}
		if err := alice.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		if s, err := alice.Inspect(ctx, "leader"); err != nil || s.Held {
			t.Fatalf("after alice's second release: %+v %v, want free", s, err)
		}
		if _, ok, err := eve.Acquire(ctx, "leader", "eve", time.Minute); err != nil || !ok {
			t.Fatalf("eve's acquire of the free key: %v %v", ok, err)
		}
	})
}

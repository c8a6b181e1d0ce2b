package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestEveryCallOnEveryQuerier runs every call of the client on a pool, on a
// single connection, and inside the caller's own transaction.
func TestEveryCallOnEveryQuerier(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		kinds := []struct {
			name string
			run  func(t *testing.T, f func(q lease.Querier))
		}{
			{"pool", func(t *testing.T, f func(lease.Querier)) { f(db.pool) }},
			{"conn", func(t *testing.T, f func(lease.Querier)) { f(connect(t, db.dsn)) }},
			{"tx", func(t *testing.T, f func(lease.Querier)) {
				withTx(t, ctx, db.pool, func(tx pgx.Tx) { f(tx) })
			}},
		}
		for _, k := range kinds {
			t.Run(k.name, func(t *testing.T) {
				key := "every-call/" + k.name
				k.run(t, func(q lease.Querier) { exerciseEveryCall(t, ctx, q, key) })
				// Whatever ran in the transaction is visible after commit.
				st, err := db.c.Inspect(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if !st.Exists || st.Held || st.Epoch != 4 {
					t.Fatalf("after the sequence: %+v, want an existing free key with epoch counter 4", st)
				}
			})
		}
	})
}

func exerciseEveryCall(t *testing.T, ctx context.Context, q lease.Querier, key string) {
	t.Helper()
	c := lease.New(q)

	st, err := c.Inspect(ctx, key)
	if err != nil || st.Exists || st.Held {
		t.Fatalf("Inspect of a never-leased key: %+v, %v", st, err)
	}

	g, ok, err := c.Acquire(ctx, key, "alice", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}
	if g.Key != key || g.Owner != "alice" || g.Epoch != 1 || g.TTL != time.Minute {
		t.Fatalf("grant %+v", g)
	}
	if r := time.Until(g.ValidUntil()); r <= 0 || r > time.Minute {
		t.Fatalf("Remaining %v, want in (0, 1m]", r)
	}

	// Idempotent for the holder: the same grant.
	g2, ok, err := c.Acquire(ctx, key, "alice", time.Hour)
	if err != nil || !ok || g2.Epoch != g.Epoch || !g2.ExpiresAt.Equal(g.ExpiresAt) {
		t.Fatalf("re-Acquire by the holder: %+v, %v, %v; first %+v", g2, ok, err, g)
	}
	// Denied for another owner, without error.
	if _, ok, err := c.Acquire(ctx, key, "bob", time.Minute); err != nil || ok {
		t.Fatalf("Acquire by another owner: ok=%v err=%v, want denied", ok, err)
	}

	st, err = c.Inspect(ctx, key)
	if err != nil || !st.Exists || !st.Held || st.Owner != "alice" || st.Epoch != 1 || !st.ExpiresAt.Equal(g.ExpiresAt) {
		t.Fatalf("Inspect while held: %+v, %v", st, err)
	}
	if st.ServerNow.IsZero() || !st.ServerNow.Before(st.ExpiresAt) {
		t.Fatalf("Inspect ServerNow %v vs expiry %v", st.ServerNow, st.ExpiresAt)
	}

	r, err := c.Renew(ctx, g.Token, 2*time.Minute)
	if err != nil || r.Epoch != g.Epoch || !r.ExpiresAt.After(g.ExpiresAt) || r.TTL != 2*time.Minute {
		t.Fatalf("Renew: %+v, %v (was %+v)", r, err, g)
	}

	all, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range all {
		if s.Key == key {
			found = true
			if !s.Held || s.Owner != "alice" || s.Epoch != 1 || s.AcquiredAt.IsZero() || !s.ExpiresAt.Equal(r.ExpiresAt) {
				t.Fatalf("List entry %+v", s)
			}
		}
	}
	if !found {
		t.Fatalf("List has no %q: %+v", key, all)
	}

	// Fence runs inside a transaction; on a pool or conn, start one; inside
	// the caller's transaction a savepoint stands in.
	withTx(t, ctx, q, func(tx pgx.Tx) {
		exp, err := lease.Fence(ctx, tx, r.Token)
		if err != nil || !exp.Equal(r.ExpiresAt) {
			t.Fatalf("Fence: %v, %v (want %v)", exp, err, r.ExpiresAt)
		}
	})

	if err := c.Release(ctx, r.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	st, err = c.Inspect(ctx, key)
	if err != nil || !st.Exists || st.Held || st.Owner != "" || st.Epoch != 2 {
		t.Fatalf("Inspect after release: %+v, %v", st, err)
	}

	// A new grant carries a greater epoch; its release moves the counter past it.
	g3, ok, err := c.Acquire(ctx, key, "bob", time.Minute)
	if err != nil || !ok || g3.Epoch != 3 {
		t.Fatalf("Acquire after release: %+v, %v, %v", g3, ok, err)
	}
	if err := c.Release(ctx, g3.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func withTx(t *testing.T, ctx context.Context, q lease.Querier, f func(pgx.Tx)) {
	t.Helper()
	b, ok := q.(beginner)
	if !ok {
		t.Fatalf("%T cannot begin a transaction", q)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	f(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGrantRolledBackWithTx: a grant made in the caller's transaction is gone
// when that transaction rolls back, and one made in a committed transaction
// stays.
func TestGrantRolledBackWithTx(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		tx, err := db.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g, ok, err := lease.New(tx).Acquire(ctx, "tx-key", "alice", time.Minute)
		if err != nil || !ok {
			t.Fatalf("Acquire in tx: %v %v", ok, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := db.c.Inspect(ctx, "tx-key")
		if err != nil || st.Exists {
			t.Fatalf("after rollback: %+v, %v; want a never-leased key", st, err)
		}
		if err := db.c.Release(ctx, g.Token); !errors.Is(err, lease.ErrNotOwner) {
			t.Fatalf("Release of the rolled-back grant: %v, want ErrNotOwner", err)
		}
		// Someone else gets it, under epoch 1: the rolled-back grant never was.
		g2, ok, err := db.c.Acquire(ctx, "tx-key", "bob", time.Minute)
		if err != nil || !ok || g2.Epoch != 1 {
			t.Fatalf("Acquire after rollback: %+v %v %v", g2, ok, err)
		}

		// A release rolled back leaves the grant held.
		tx, err = db.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.New(tx).Release(ctx, g2.Token); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		if _, err := db.c.Renew(ctx, g2.Token, time.Minute); err != nil {
			t.Fatalf("Renew after a rolled-back release: %v", err)
		}
	})
}

// TestSentinels: every sentinel error, matched with errors.Is, with the
// server's *pgconn.PgError reachable by errors.As where the server raised it.
func TestSentinels(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c := db.c
		g, ok, err := c.Acquire(ctx, "k", "alice", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}

		lost := func(t *testing.T, err error, want error, pg bool) {
			t.Helper()
			if !errors.Is(err, want) || !errors.Is(err, lease.ErrLost) {
				t.Fatalf("err %v: want %v and ErrLost", err, want)
			}
			for _, other := range []error{lease.ErrNotOwner, lease.ErrLapsed, lease.ErrEpochMismatch} {
				if other != want && errors.Is(err, other) {
					t.Fatalf("err %v also matches %v", err, other)
				}
			}
			var pgErr *pgconn.PgError
			if got := errors.As(err, &pgErr); got != pg {
				t.Fatalf("errors.As PgError = %v, want %v (%v)", got, pg, err)
			}
			if pg && (pgErr.Code != "55000" || pgErr.Detail == "") {
				t.Fatalf("PgError %+v", pgErr)
			}
		}
		fence := func(tok lease.Token) error {
			tx, err := db.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			_, err = lease.Fence(ctx, tx, tok)
			return err
		}

		t.Run("not_owner", func(t *testing.T) {
			bob := lease.Token{Key: "k", Owner: "bob", Epoch: g.Epoch}
			_, err := c.Renew(ctx, bob, time.Minute)
			lost(t, err, lease.ErrNotOwner, false)
			lost(t, c.Release(ctx, bob), lease.ErrNotOwner, false)
			lost(t, fence(bob), lease.ErrNotOwner, true)
			never := lease.Token{Key: "never", Owner: "alice", Epoch: 1}
			_, err = c.Renew(ctx, never, time.Minute)
			lost(t, err, lease.ErrNotOwner, false)
		})
		t.Run("epoch_mismatch", func(t *testing.T) {
			other := g.Token
			other.Epoch += 5
			_, err := c.Renew(ctx, other, time.Minute)
			lost(t, err, lease.ErrEpochMismatch, false)
			lost(t, c.Release(ctx, other), lease.ErrEpochMismatch, false)
			lost(t, fence(other), lease.ErrEpochMismatch, true)
		})
		t.Run("lapsed", func(t *testing.T) {
			short, ok, err := c.Acquire(ctx, "short", "alice", 5*time.Millisecond)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			pgtest.WaitServerPast(t, db.pool, short.ExpiresAt)
			_, err = c.Renew(ctx, short.Token, time.Minute)
			lost(t, err, lease.ErrLapsed, false)
			lost(t, c.Release(ctx, short.Token), lease.ErrLapsed, false)
			lost(t, fence(short.Token), lease.ErrLapsed, true)
			// Taken over: the former holder still hears "lapsed".
			if _, ok, err := c.Acquire(ctx, "short", "bob", time.Minute); err != nil || !ok {
				t.Fatal(ok, err)
			}
			_, err = c.Renew(ctx, short.Token, time.Minute)
			lost(t, err, lease.ErrLapsed, false)
		})
		t.Run("invalid_input", func(t *testing.T) {
			_, _, err := c.Acquire(ctx, "", "", time.Minute)
			var pgErr *pgconn.PgError
			if !errors.Is(err, lease.ErrInvalidInput) || !errors.As(err, &pgErr) {
				t.Fatalf("Acquire('', ''): %v, want ErrInvalidInput with a PgError", err)
			}
			if pgErr.Code != "22023" || !strings.Contains(pgErr.Detail, "key must not be empty") ||
				!strings.Contains(pgErr.Detail, "owner must not be empty") {
				t.Fatalf("PgError %q / %q: want both violations in DETAIL", pgErr.Code, pgErr.Detail)
			}
			long := strings.Repeat("x", 1025)
			for name, call := range map[string]func() error{
				"renew": func() error {
					_, err := c.Renew(ctx, lease.Token{Key: long, Owner: "a", Epoch: 1}, time.Minute)
					return err
				},
				"release": func() error { return c.Release(ctx, lease.Token{Key: "k", Owner: "a", Epoch: 0}) },
				"inspect": func() error { _, err := c.Inspect(ctx, ""); return err },
				"fence":   func() error { return fence(lease.Token{Key: "", Owner: "a", Epoch: 1}) },
			} {
				err := call()
				if !errors.Is(err, lease.ErrInvalidInput) || !errors.As(err, &pgErr) || pgErr.Detail == "" {
					t.Errorf("%s: %v, want ErrInvalidInput with DETAIL", name, err)
				}
			}
			// Arguments that cannot be sent faithfully fail before a round trip.
			for _, d := range []time.Duration{0, -time.Second, 500 * time.Nanosecond} {
				_, _, err := c.Acquire(ctx, "k2", "a", d)
				if !errors.Is(err, lease.ErrInvalidInput) || errors.As(err, &pgErr) {
					t.Errorf("Acquire ttl %v: %v, want a client-side ErrInvalidInput", d, err)
				}
			}
			if _, err := c.AcquireWait(ctx, "k2", "a", time.Minute, -time.Second); !errors.Is(err, lease.ErrInvalidInput) {
				t.Errorf("AcquireWait negative wait: %v", err)
			}
		})
		t.Run("wait_timeout", func(t *testing.T) {
			_, err := c.AcquireWait(ctx, "k", "bob", time.Minute, 20*time.Millisecond)
			var pgErr *pgconn.PgError
			if !errors.Is(err, lease.ErrWaitTimeout) || !errors.As(err, &pgErr) || pgErr.Code != "57014" || pgErr.Detail == "" {
				t.Fatalf("AcquireWait on a held key: %v, want ErrWaitTimeout with DETAIL", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("server timeout confused with a context deadline: %v", err)
			}
		})
		t.Run("invalid_isolation", func(t *testing.T) {
			for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
				tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				if err != nil {
					t.Fatal(err)
				}
				_, err = lease.New(tx).AcquireWait(ctx, "iso", "bob", time.Minute, time.Second)
				_ = tx.Rollback(ctx)
				var pgErr *pgconn.PgError
				if !errors.Is(err, lease.ErrInvalidIsolation) || !errors.As(err, &pgErr) || !strings.Contains(pgErr.Detail, "READ COMMITTED") {
					t.Fatalf("%s: %v, want ErrInvalidIsolation", iso, err)
				}
			}
		})
		t.Run("wait_succeeds", func(t *testing.T) {
			// The server-side wait: a release during it hands the key over.
			done := make(chan error, 1)
			var got lease.Grant
			go func() {
				var err error
				got, err = c.AcquireWait(ctx, "waited", "bob", time.Minute, time.Minute)
				done <- err
			}()
			h, ok, err := c.Acquire(ctx, "waited", "alice", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if ok { // alice won the race: release it, bob's wait then succeeds
				if err := c.Release(ctx, h.Token); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("AcquireWait: %v", err)
			}
			if got.Owner != "bob" || got.Epoch < 1 {
				t.Fatalf("grant %+v", got)
			}
		})
	})
}

// TestNotInstalled: every call on a database without pg_lease says
// ErrNotInstalled, as does Installed.
func TestNotInstalled(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, pgtest.NewDatabase(t))
	c := lease.New(pool)
	tok := lease.Token{Key: "k", Owner: "a", Epoch: 1}
	calls := map[string]func() error{
		"acquire":     func() error { _, _, err := c.Acquire(ctx, "k", "a", time.Minute); return err },
		"acquirewait": func() error { _, err := c.AcquireWait(ctx, "k", "a", time.Minute, time.Second); return err },
		"renew":       func() error { _, err := c.Renew(ctx, tok, time.Minute); return err },
		"release":     func() error { return c.Release(ctx, tok) },
		"inspect":     func() error { _, err := c.Inspect(ctx, "k"); return err },
		"list":        func() error { _, err := c.List(ctx); return err },
		"fence": func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = lease.Fence(ctx, tx, tok)
			return err
		},
		"installed": func() error { _, _, err := leaseadmin.Installed(ctx, pool); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, lease.ErrNotInstalled) {
			t.Errorf("%s: %v, want ErrNotInstalled", name, err)
		}
	}
}

// TestValidUntilNeverAfterServerExpiry runs the server with its clock moved
// far from the client's and checks, against the server clock seen through a
// measured offset, that ValidUntil never comes after the server's expiry.
func TestValidUntilNeverAfterServerExpiry(t *testing.T) {
	s := pgtest.New(t, pgtest.Options{FakeClock: true})
	for _, m := range installModes {
		t.Run(m.Name, func(t *testing.T) {
			db := newDBOn(t, s, m)
			ctx := testCtx(t)
			conn := connect(t, db.dsn)
			c := lease.New(conn)
			for _, shift := range []time.Duration{0, 47 * time.Second, -31 * time.Second} {
				if err := s.SetClockOffset(shift); err != nil {
					t.Fatal(err)
				}
				off := measureOffset(t, conn)
				if d := off.Offset() - shift; d < -time.Second || d > time.Second {
					t.Fatalf("measured offset %v, server clock moved by %v", off.Offset(), shift)
				}
				check := func(what string, g lease.Grant, sent, recv time.Time) {
					t.Helper()
					// The server's expiry is locally within ToLocal(E) ± RTT/2.
					latest := off.ToLocal(g.ExpiresAt).Add(off.RTT / 2)
					if g.ValidUntil().After(latest) {
						t.Fatalf("%s (shift %v): ValidUntil %v is after the server's expiry, seen locally no later than %v",
							what, shift, g.ValidUntil(), latest)
					}
					// ...and not needlessly early: at most the call's own round
					// trip plus the offset's uncertainty.
					earliest := off.ToLocal(g.ExpiresAt).Add(-off.RTT/2 - recv.Sub(sent))
					if g.ValidUntil().Before(earliest) {
						t.Fatalf("%s (shift %v): ValidUntil %v is more than a round trip before the expiry (%v)",
							what, shift, g.ValidUntil(), earliest)
					}
				}
				key := "valid-until/" + shift.String()
				sent := time.Now()
				g, ok, err := c.Acquire(ctx, key, "alice", 10*time.Second)
				recv := time.Now()
				if err != nil || !ok {
					t.Fatal(ok, err)
				}
				check("acquire", g, sent, recv)
				sent = time.Now()
				g, err = c.Renew(ctx, g.Token, 20*time.Second)
				recv = time.Now()
				if err != nil {
					t.Fatal(err)
				}
				check("renew", g, sent, recv)
				sent = time.Now()
				g2, err := c.AcquireWait(ctx, key+"/w", "bob", 10*time.Second, time.Second)
				recv = time.Now()
				if err != nil {
					t.Fatal(err)
				}
				check("acquire wait", g2, sent, recv)
			}
		})
	}
}

// clockOffset relates the server's clock to the local one from the
// shortest of a few round trips of SELECT clock_timestamp(): the server read
// its clock within ±RTT/2 of the local midpoint.
type clockOffset struct {
	local, server time.Time
	RTT           time.Duration
}

func (o clockOffset) Offset() time.Duration { return o.server.Sub(o.local.Round(0)) }

func (o clockOffset) ToLocal(server time.Time) time.Time { return o.local.Add(server.Sub(o.server)) }

func measureOffset(t testing.TB, q lease.Querier) clockOffset {
	t.Helper()
	var best clockOffset
	for range 5 {
		var server time.Time
		t0 := time.Now()
		if err := q.QueryRow(testCtx(t), `SELECT clock_timestamp()`).Scan(&server); err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(t0)
		if best.local.IsZero() || rtt < best.RTT {
			best = clockOffset{local: t0.Add(rtt / 2), server: server, RTT: rtt}
		}
	}
	return best
}

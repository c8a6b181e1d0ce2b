package elector_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestDatabaseUnreachable: with the server frozen (SIGSTOP) or stopped, the
// leader context is cancelled before the grant's server-side expiry; the
// local cancel instant is compared with the expiry through the measured
// clock offset. A renewal that was in flight when the database went away
// may still be applied by the server later (a frozen backend executes it
// after the thaw): the server then holds the grant longer than the elector
// knows, which delays a takeover but never lets the elector lead under the
// old epoch again: re-running it yields a new epoch.
func TestDatabaseUnreachable(t *testing.T) {
	s := pgtest.New(t)
	for _, mode := range []string{"freeze", "stop"} {
		t.Run(mode, func(t *testing.T) {
			dsn := installed(t, s)
			pool := newPool(t, dsn)
			// One server without standbys, as its operator would configure
			// it: the campaign after the restart ("stop") is granted at once,
			// above the restart's epoch base (in the default mode 'any', a
			// restart starts a grace of max_ttl).
			if _, err := pool.Exec(testCtx(t), "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
				t.Fatal(err)
			}
			offset, uncert := clockOffset(t, pool)
			runCtx, stopRun := context.WithCancel(context.Background())
			defer stopRun()
			type end struct {
				at       time.Time
				cause    error
				grant    lease.Grant
				deadline time.Time // the term's, at which the deadline timer cancels
			}
			ended := make(chan end, 1)
			second := make(chan lease.Token, 1)
			var el *elector.Elector
			var err error
			el, err = elector.New(lease.New(pool), elector.Config{
				Key: "unreachable", TTL: 2 * time.Second, RetryInterval: 100 * time.Millisecond,
				Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) {
					if tok, _ := lease.TokenFromContext(ctx); tok.Epoch > 1 {
						second <- tok
						<-ctx.Done()
						return
					}
					<-ctx.Done()
					st := el.Status()
					e := end{at: time.Now(), cause: context.Cause(ctx), grant: st.Grant, deadline: st.Deadline}
					stopRun() // no new campaign: the row keeps the last grant
					ended <- e
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			runDone := make(chan error, 1)
			go func() { runDone <- el.Run(runCtx) }()
			for !el.Status().Leading {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(time.Second) // renewals happen
			lostAt := time.Now()
			switch mode {
			case "freeze":
				if err := s.Freeze(); err != nil {
					t.Fatal(err)
				}
			case "stop":
				if err := s.Stop(); err != nil {
					t.Fatal(err)
				}
			}
			var e end
			select {
			case e = <-ended:
			case <-time.After(time.Minute):
				_ = s.Thaw()
				t.Fatal("leader context not cancelled within a minute of losing the database")
			}
			switch mode {
			case "freeze":
				if err := s.Thaw(); err != nil {
					t.Fatal(err)
				}
			case "stop":
				if err := s.Start(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-runDone; err != nil {
				t.Errorf("Run: %v", err)
			}
			if !errors.Is(e.cause, lease.ErrLocalDeadline) {
				t.Errorf("cause %v, want lease.ErrLocalDeadline", e.cause)
			}
			// The server's record of the last grant.
			pool2 := newPool(t, dsn)
			var expires time.Time
			if err := pool2.QueryRow(testCtx(t), "SELECT expires_at FROM lease.leases WHERE key = 'unreachable'").Scan(&expires); err != nil {
				t.Fatal(err)
			}
			if expires.Before(e.grant.ExpiresAt) {
				t.Errorf("server expiry %v before the elector's last grant %v", expires, e.grant.ExpiresAt)
			}
			// Cancelled by the deadline timer (the cause says so): the instant
			// the term set for it is held against the expiry; the callback
			// observes the cancellation a scheduling delay later.
			if e.deadline.IsZero() || e.at.Before(e.deadline) {
				t.Fatalf("term deadline %v, cancellation observed at %v: want it at or after the deadline", e.deadline, e.at)
			}
			cancelServer := e.deadline.Add(offset)
			if !cancelServer.Add(uncert).Before(e.grant.ExpiresAt) {
				t.Errorf("deadline at server time %v (±%v), not before the expiry %v", cancelServer, uncert, e.grant.ExpiresAt)
			}
			t.Logf("%s: leader context cancelled %v after losing the database, %v before the expiry of the last grant it knew (margin %v); server-side expiry %v later than that",
				mode, e.at.Sub(lostAt).Round(time.Millisecond), e.grant.ExpiresAt.Sub(cancelServer).Round(time.Millisecond),
				elector.ConfigOf(el).Margin, expires.Sub(e.grant.ExpiresAt).Round(time.Millisecond))

			// Campaign again: never under the old epoch.
			ctx, cancel := context.WithCancel(context.Background())
			go func() { runDone <- el.Run(ctx) }()
			select {
			case tok := <-second:
				if tok.Epoch <= e.grant.Epoch {
					t.Errorf("new term under epoch %d after a term under %d", tok.Epoch, e.grant.Epoch)
				}
			case <-time.After(time.Minute):
				t.Error("no new term within a minute")
			}
			cancel()
			if err := <-runDone; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

package failure

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// call is one renewal attempt by the pool holder.
type call struct {
	key    string
	start  time.Time // when the call was made
	at     time.Time // when it returned
	err    error
	epoch  int64
	expiry time.Time
}

// Server crash (SIGKILL) and clean restart while a holder keeps renewing
// through a pgxpool: its calls fail while the server is down and succeed
// after, with the epoch unchanged for the grant that did not expire, and
// lapsed for the one that did.
func TestServerDownWhilePoolHolderRenews(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := e.pool(t, 2)
	c := lease.New(pool)
	const longTTL, shortTTL = time.Minute, time.Second

	for _, mode := range []string{"crash", "clean"} {
		t.Run(mode, func(t *testing.T) {
			long := mustAcquire(t, c, "long-"+mode, "holder", longTTL)
			short := mustAcquire(t, c, "short-"+mode, "holder", shortTTL)
			grants := map[string]lease.Grant{long.Key: long, short.Key: short}
			ttls := map[string]time.Duration{long.Key: longTTL, short.Key: shortTTL}

			var calls pgtest.Log[call]
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() { // the holder: renew both every 100 ms until lost
				defer close(done)
				active := map[string]bool{long.Key: true, short.Key: true}
				for len(active) > 0 {
					for key := range active {
						cctx, cancel := context.WithTimeout(ctx, time.Second)
						start := time.Now()
						g, err := c.Renew(cctx, grants[key].Token, ttls[key])
						cancel()
						calls.Add(call{key: key, start: start, at: time.Now(), err: err, epoch: g.Epoch, expiry: g.ExpiresAt})
						if errors.Is(err, lease.ErrLost) {
							delete(active, key)
						}
					}
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
			defer func() { close(stop); <-done }()

			okCount := func(key string, after time.Time) (n int, last call) {
				for _, cl := range calls.All() {
					if cl.key == key && cl.err == nil && cl.at.After(after) {
						n++
						last = cl
					}
				}
				return
			}
			pgtest.Eventually(t, 30*time.Second, "three renewals of each key", func() bool {
				n1, _ := okCount(long.Key, time.Time{})
				n2, _ := okCount(short.Key, time.Time{})
				return n1 >= 3 && n2 >= 3
			})

			down := time.Now()
			var err error
			if mode == "crash" {
				err = e.srv.Kill()
			} else {
				err = e.srv.Stop()
			}
			if err != nil {
				t.Fatal(err)
			}
			downDone := time.Now()
			// The holder's calls fail while the server is down.
			pgtest.Eventually(t, 30*time.Second, "a failed renewal during the downtime", func() bool {
				for _, cl := range calls.All() {
					if cl.at.After(downDone) && cl.err != nil && !errors.Is(cl.err, lease.ErrLost) {
						return true
					}
				}
				return false
			})
			// Keep it down past the short grant's expiry (time must pass): a
			// renewal in flight at the stop may have committed unseen, so
			// count from the stop.
			waitLocalPast(downDone.Add(shortTTL), 200*time.Millisecond)
			starting := time.Now()
			if err := e.srv.Start(ctx); err != nil {
				t.Fatal(err)
			}
			up := time.Now()

			pgtest.Eventually(t, 30*time.Second, "two renewals of the long grant after the restart, and the short one's fate", func() bool {
				n, _ := okCount(long.Key, up)
				decided := false // lost, or (wrongly) renewed: checked below
				for _, cl := range calls.All() {
					decided = decided || (cl.key == short.Key && (errors.Is(cl.err, lease.ErrLost) ||
						cl.err == nil && cl.start.After(downDone)))
				}
				return n >= 2 && decided
			})
			failed := 0
			for _, cl := range calls.All() {
				switch {
				case cl.start.After(downDone) && cl.at.Before(starting) && cl.err == nil:
					t.Errorf("%s: a renewal succeeded while the server was down (at %v)", cl.key, cl.at.Sub(down))
				case cl.start.After(downDone) && cl.at.Before(starting):
					failed++
				case cl.key == long.Key && cl.err == nil && cl.epoch != long.Epoch:
					t.Errorf("long grant renewed at epoch %d after the restart, want %d", cl.epoch, long.Epoch)
				case cl.start.After(downDone) && cl.key == short.Key && cl.err == nil:
					t.Errorf("short grant (expired during the downtime) renewed after the restart: expiry %v", cl.expiry)
				case cl.key == short.Key && errors.Is(cl.err, lease.ErrLost) && !errors.Is(cl.err, lease.ErrLapsed):
					t.Errorf("short grant: %v, want lapsed", cl.err)
				}
			}
			var firstOK time.Duration
			for _, cl := range calls.All() {
				if cl.key == long.Key && cl.at.After(up) && cl.err == nil {
					firstOK = cl.at.Sub(up)
					break
				}
			}
			var shortLast error
			for _, cl := range calls.All() {
				if cl.key == short.Key {
					shortLast = cl.err
				}
			}
			t.Logf("%s: down %v, %d renewals failed meanwhile; long grant renewed %v after the server was up, epoch %d; short grant's last renewal: %v",
				mode, up.Sub(down).Round(time.Millisecond), failed, firstOK.Round(time.Millisecond), long.Epoch, shortLast)
			// Another owner takes the short key, above the restart's epoch base
			// (promotion mode 'synchronous': no grace).
			g, ok, err := c.Acquire(ctx, short.Key, "other", time.Minute)
			if err != nil || !ok || g.Epoch != afterRestart(short.Epoch) {
				t.Errorf("other owner's acquire of %s: %v ok=%t err=%v", short.Key, g.Token, ok, err)
			}
			if s := inspect(t, c, long.Key); !s.Held || s.Owner != "holder" || s.Epoch != long.Epoch {
				t.Errorf("%s", fmt.Sprint("long grant after restart: ", stateString(s)))
			}
		})
	}
}

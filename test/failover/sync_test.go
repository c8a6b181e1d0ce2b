package failover

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// keyState is what a sequence of acknowledged calls leaves on a key.
type keyState struct {
	held    bool
	owner   string
	epoch   int64
	expires time.Time
}

// op is one call of a per-key sequence: acquire (by owner), renew or
// release of the current grant.
type op struct {
	kind  string
	owner string
}

func opSequence(key string) []op {
	var ops []op
	for i := 1; len(ops) < 40; i++ {
		ops = append(ops, op{"acquire", fmt.Sprintf("%s-o%d", key, i)}, op{kind: "renew"}, op{kind: "release"})
	}
	return ops
}

// TestSyncEveryAcknowledgedChangeSurvives: a primary with one synchronous
// standby (synchronous_standby_names), clients whose sessions run at
// synchronous_commit = off (the weakest setting pg_lease's durability
// forcing raises). Each key gets a sequence of acquire, renew, release by
// changing owners; then the standby is cut off (as by a network failure)
// and the sequences go on, every call bounded; the primary is killed and
// the standby promoted. Every key on the promoted server is in the state its
// last acknowledged call left (or in the state of the one call that was
// running, unacknowledged, when the standby was cut off): every
// acknowledged grant, renewal and release survived.
func TestSyncEveryAcknowledgedChangeSurvives(t *testing.T) {
	_, p, st := newPair(t, time.Hour)
	ctx := pgtest.Context(t, 3*time.Minute)
	if err := p.SetSynchronousStandbyNames(ctx, st.StandbyName()); err != nil {
		t.Fatal(err)
	}
	const keys = 4
	type worker struct {
		key     string
		conn    *pgx.Conn
		ops     []op
		next    int // ops[:next] were called
		acked   keyState
		pending *op // called, not acknowledged (timed out)
		grant   lease.Grant
		err     error
	}
	ws := make([]*worker, keys)
	for i := range ws {
		conn := pgtest.Connect(t, dsn(p))
		if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("k%d", i)
		ws[i] = &worker{key: k, conn: conn, ops: opSequence(k)}
	}
	// run calls up to n more operations of w's sequence, stopping at the
	// first one not acknowledged within the bound.
	run := func(w *worker, n int, bound time.Duration) {
		cl := lease.New(w.conn)
		for ; n > 0 && w.next < len(w.ops) && w.pending == nil; n-- {
			o := w.ops[w.next]
			w.next++
			cctx, cancel := opCtx(bound)
			var err error
			switch o.kind {
			case "acquire":
				var ok bool
				var g lease.Grant
				g, ok, err = cl.Acquire(cctx, w.key, o.owner, 10*time.Minute)
				if err == nil && !ok {
					err = errors.New("acquire denied on a free key")
				}
				if err == nil {
					w.grant = g
					w.acked = keyState{held: true, owner: o.owner, epoch: g.Epoch, expires: g.ExpiresAt}
				}
			case "renew":
				var g lease.Grant
				g, err = cl.Renew(cctx, w.grant.Token, 10*time.Minute)
				if err == nil {
					w.grant = g
					w.acked.expires = g.ExpiresAt
				}
			case "release":
				err = cl.Release(cctx, w.grant.Token)
				if err == nil {
					w.acked.held = false
				}
			}
			timedOut := cctx.Err() != nil
			cancel()
			if err != nil {
				if timedOut {
					w.pending = &o // unacknowledged: it may or may not have committed
					return
				}
				w.err = err
				return
			}
		}
	}
	parallel := func(f func(w *worker)) {
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() { f(w) })
		}
		wg.Wait()
	}
	parallel(func(w *worker) { run(w, 7, 30*time.Second) }) // ends holding: acquire, renew, release, acquire, renew, release, acquire
	for _, w := range ws {
		if w.err != nil || w.pending != nil {
			t.Fatalf("%s before the cut: %v (pending %v)", w.key, w.err, w.pending)
		}
	}
	if err := st.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	parallel(func(w *worker) { run(w, 6, time.Second) })
	acked := 0
	for _, w := range ws {
		if w.err != nil {
			t.Fatalf("%s after the cut: %v", w.key, w.err)
		}
		acked += w.next - 7
		if w.pending != nil {
			acked--
		}
	}
	t.Logf("%d calls acknowledged after the synchronous standby was cut off", acked)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	obs := lease.New(pgtest.Connect(t, dsn(st)))
	for _, w := range ws {
		s, err := obs.Inspect(ctx, w.key)
		if err != nil {
			t.Fatal(err)
		}
		got := keyState{held: s.Held, owner: s.Owner, epoch: s.Epoch, expires: s.ExpiresAt}
		if !s.Held {
			got.owner, got.expires = "", time.Time{}
		}
		want := w.acked
		if !want.held {
			want.owner, want.expires = "", time.Time{}
		}
		if got.held == want.held && got.owner == want.owner && got.epoch == want.epoch && got.expires.Equal(want.expires) {
			continue
		}
		// The call running when the standby was cut off may have committed
		// there without being acknowledged.
		if o := w.pending; o != nil {
			switch {
			case o.kind == "release" && !got.held && got.epoch == want.epoch,
				o.kind == "renew" && got.held && got.owner == want.owner && got.epoch == want.epoch && got.expires.After(want.expires),
				o.kind == "acquire" && got.held && got.owner == o.owner && got.epoch > want.epoch:
				continue
			}
		}
		t.Errorf("%s after promotion: held=%t owner=%q epoch=%d expires=%s; the last acknowledged call (%d calls, pending %v) left held=%t owner=%q epoch=%d expires=%s",
			w.key, got.held, got.owner, got.epoch, got.expires.Format(time.RFC3339Nano), w.next, w.pending,
			want.held, want.owner, want.epoch, want.expires.Format(time.RFC3339Nano))
	}
}

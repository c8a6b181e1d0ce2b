package ha

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// ledger drives one key through pkg/lease alone (acquire, renewals,
// release, again) and checks, after every call that failed (its outcome
// unknown), that the server it reaches next shows the state the last
// acknowledged call left, or the one the failed call would have left. In
// the synchronous modes a mismatch is an acknowledged change lost in a
// failover; in the asynchronous mode it is expected and only counted.
type ledger struct {
	client *lease.Client
	key    string

	warn   syncWarnings
	calls  *callLog // the ledger's calls, to say where a lost change was made and read
	mu     sync.Mutex
	warned int // calls that returned success with the cancelled-wait warning
	acked  int
	checks int
	lost   []string
}

const ledgerKey, ledgerOwner = "ledger", "ledger"

var errWarned = errors.New("commit carried the cancelled-wait warning")

func startLedger(w *world) *ledger {
	l := &ledger{key: ledgerKey}
	// One connection: a warning seen during a call is that call's.
	l.client = lease.New(w.pool(pgtest.MaxConns(1), l.warn.option(), w.calls.option(ledgerKey, ledgerOwner)))
	l.calls = &w.calls
	w.wg.Go(func() { l.run(w.runCtx) })
	return l
}

// expect is what a state read after an unknown outcome may show: the
// epoch counter and whether the ledger holds it, with anyEpochAbove for
// an acquire whose grant's epoch is not known.
type expect struct {
	held  bool
	epoch int64
	// acquire in doubt: a grant above epoch is as good as none.
	grantAbove bool
	at         time.Time // when the call that left it was answered
}

func (e expect) matches(s lease.State) bool {
	if e.grantAbove && s.Epoch > e.epoch && (!s.Held || s.Owner == ledgerOwner) {
		return true
	}
	if s.Epoch != e.epoch {
		return false
	}
	// A grant seen lapsed (the failover outlasted its TTL) still counts.
	return !s.Held || (e.held && s.Owner == ledgerOwner)
}

func (e expect) String() string {
	s := fmt.Sprintf("epoch %d", e.epoch)
	if e.held {
		s += " held by " + ledgerOwner
	}
	if e.grantAbove {
		s += " (or a grant above it)"
	}
	return s
}

func (l *ledger) run(ctx context.Context) {
	var (
		held  bool
		tok   lease.Token
		last  = expect{} // the state the last acknowledged call left
		renew int
	)
	do := func(f func(context.Context) error) error {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		before := l.warn.total.Load()
		err := f(c)
		if l.warn.total.Load() != before {
			// The commit carried the cancelled-wait warning: the change may
			// exist on this server only. Its outcome is unknown (pkg/lease
			// says so with ErrCommitUnknown).
			l.mu.Lock()
			l.warned++
			l.mu.Unlock()
			if err == nil {
				err = errWarned
			}
		}
		return err
	}
	for ctx.Err() == nil {
		var err error
		var doubt expect
		switch {
		case !held:
			var g lease.Grant
			var ok bool
			doubt = expect{epoch: last.epoch, grantAbove: true}
			err = do(func(c context.Context) (err error) {
				g, ok, err = l.client.Acquire(c, l.key, ledgerOwner, ttl)
				return err
			})
			if err == nil && ok {
				held, tok, renew = true, g.Token, 0
				last = expect{held: true, epoch: g.Epoch, at: time.Now()}
				l.ack()
			}
		case renew < 3:
			doubt = last
			err = do(func(c context.Context) error { _, err := l.client.Renew(c, tok, ttl); return err })
			if err == nil {
				renew++
				last.at = time.Now()
				l.ack()
			}
		default:
			doubt = expect{epoch: tok.Epoch + 1}
			err = do(func(c context.Context) error { return l.client.Release(c, tok) })
			if err == nil {
				held = false
				last = expect{epoch: tok.Epoch + 1, at: time.Now()}
				l.ack()
			}
		}
		if err != nil && ctx.Err() == nil {
			// Unknown outcome, or a lapsed grant: read what the server now
			// has, and go on from there.
			var s lease.State
			for ctx.Err() == nil {
				if err = do(func(c context.Context) (err error) { s, err = l.client.Inspect(c, l.key); return err }); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
			l.check(last, doubt, s)
			held = s.Held && s.Owner == ledgerOwner
			tok = lease.Token{Key: l.key, Owner: ledgerOwner, Epoch: s.Epoch}
			last = expect{held: held, epoch: s.Epoch}
			renew = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *ledger) ack() {
	l.mu.Lock()
	l.acked++
	l.mu.Unlock()
}

func (l *ledger) check(last, doubt expect, s lease.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checks++
	if !s.Exists && last.epoch == 0 {
		return
	}
	if last.matches(s) || doubt.matches(s) {
		return
	}
	ackPort, readPort := l.calls.portAt(ledgerKey, last.at), l.calls.portAt(ledgerKey, time.Now())
	l.lost = append(l.lost, fmt.Sprintf("after a failed call the server (port %d, at %s) shows epoch %d held=%v owner=%q; the last acknowledged call (port %d, at %s) left %s, the failed one would have left %s",
		readPort, time.Now().Format("15:04:05.000"), s.Epoch, s.Held, s.Owner, ackPort, last.at.Format("15:04:05.000"), last, doubt))
}

func (l *ledger) report() (acked, checks, warned int, lost []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked, l.checks, l.warned, append([]string(nil), l.lost...)
}

package elector_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// cancelOnAcquire is a Querier whose first lease.acquire runs to the end on
// the server and then cancels Run's context: committed says whether the
// caller hears of the grant (false: the call reports a connection error, as
// pgx does when a cancelled context closed the connection after the server
// had committed).
type cancelOnAcquire struct {
	lease.Querier
	cancel    context.CancelFunc
	committed bool
	done      bool
}

type cancelRow struct {
	row    pgx.Row
	q      *cancelOnAcquire
	active bool
}

func (r cancelRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if r.active {
		r.q.cancel()
		if err == nil && !r.q.committed {
			return errors.New("conn closed")
		}
	}
	return err
}

func (q *cancelOnAcquire) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "lease.acquire") && !q.done {
		q.done = true
		return cancelRow{q.Querier.QueryRow(context.WithoutCancel(ctx), sql, args...), q, true}
	}
	return q.Querier.QueryRow(ctx, sql, args...)
}

// TestRunReleasesAGrantObtainedAsItsContextEnds: the grant of an acquire
// that completes as Run's context ends, whether its answer arrived or not,
// is released before Run returns, so followers need not wait the TTL.
func TestRunReleasesAGrantObtainedAsItsContextEnds(t *testing.T) {
	dsn := installed(t, nil)
	admin := lease.New(newPool(t, dsn))
	for _, committed := range []bool{true, false} {
		name := map[bool]string{true: "answer arrived", false: "answer lost"}[committed]
		t.Run(name, func(t *testing.T) {
			key := "cancel/" + name
			ctx, cancel := context.WithCancel(testCtx(t))
			q := &cancelOnAcquire{Querier: newPool(t, dsn), cancel: cancel, committed: committed}
			el, err := elector.New(lease.New(q), elector.Config{
				Key: key, Identity: "me", TTL: time.Hour,
				Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) {
					t.Error("a term started after Run's context ended")
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := el.Run(ctx); err != nil {
				t.Fatal(err)
			}
			s, err := admin.Inspect(testCtx(t), key)
			if err != nil || !s.Exists || s.Held {
				t.Fatalf("after Run returned: %+v, %v; want the grant (epoch 1) released", s, err)
			}
		})
	}
}

// TestResignKeepsTheTermUntilTheCallbackReturns: when Run's context ends,
// the leader context is cancelled at once, but the grant is renewed until
// OnStartedLeading returns (here after twice the TTL) and then released:
// the key is free with its epoch moved on (a release), not lapsed.
func TestResignKeepsTheTermUntilTheCallbackReturns(t *testing.T) {
	dsn := installed(t, nil)
	admin := lease.New(newPool(t, dsn))
	ctx, cancel := context.WithCancel(testCtx(t))
	// Long enough that renewals keep up on a loaded machine: the test is
	// about outliving one TTL, not about a short one.
	const ttl = 2 * time.Second
	leading := make(chan lease.Token, 1)
	el, err := elector.New(lease.New(newPool(t, dsn)), elector.Config{
		Key: "slow", Identity: "me", TTL: ttl,
		Callbacks: elector.Callbacks{OnStartedLeading: func(lctx context.Context) {
			tok, _ := lease.TokenFromContext(lctx)
			leading <- tok
			<-lctx.Done()
			if !errors.Is(context.Cause(lctx), lease.ErrReleased) {
				t.Errorf("leader context cause %v, want ErrReleased", context.Cause(lctx))
			}
			time.Sleep(2 * ttl) // slow to stop: the term must outlive its TTL
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	tok := <-leading
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s, err := admin.Inspect(testCtx(t), "slow")
	if err != nil || s.Held || s.Epoch != tok.Epoch+1 {
		t.Fatalf("after Run returned: %+v, %v; want released (epoch %d), not lapsed", s, err, tok.Epoch+1)
	}
}

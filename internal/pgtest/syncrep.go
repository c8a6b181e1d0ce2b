package pgtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CancelSyncWaits names a synchronous standby that never connects on s, so
// that every commit that writes waits for it, and cancels (pg_cancel_backend)
// each backend of database dbname found in that wait, every 10 ms until the
// test ends. Such a commit succeeds with a WARNING that it might not have
// been replicated. It returns the count of waits cancelled so far.
func CancelSyncWaits(t testing.TB, s *Server, dbname string) *atomic.Int64 {
	t.Helper()
	ctx := Context(t, time.Minute)
	if err := s.SetSynchronousStandbyNames(ctx, "absent_standby"); err != nil {
		t.Fatal(err)
	}
	admin := Connect(t, s.DSN())
	var n atomic.Int64
	ictx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ictx.Err() == nil {
			var c int64
			if err := admin.QueryRow(ictx, `SELECT count(*) FILTER (WHERE pg_cancel_backend(pid))
			    FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = $1`, dbname).Scan(&c); err == nil {
				n.Add(c)
			}
			select {
			case <-ictx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	return &n
}

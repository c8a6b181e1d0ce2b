package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// StandbyOptions is pgserver.StandbyOptions.
type StandbyOptions = pgserver.StandbyOptions

// MultiHostDSN is pgserver.MultiHostDSN: servers in order, read-write.
var MultiHostDSN = pgserver.MultiHostDSN

// NewStandby makes a streaming standby of primary (a throwaway server of the
// test's own: New) with pg_basebackup -R and closes it at cleanup; see
// pgserver.Server.StartStandby. Promote it with Promote or PromoteSQL, cut
// it off with StopStreaming, make it synchronous with
// primary.SetSynchronousStandbyNames.
func NewStandby(t testing.TB, primary *Server, o StandbyOptions) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := primary.StartStandby(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: standby %s log (%s), last part:\n%s", st.StandbyName(), st.LogPath(), lastBytes(st.Log(), 8<<10))
		}
		if err := st.Close(); err != nil {
			t.Errorf("pgtest: Close standby: %v", err)
		}
	})
	return st
}

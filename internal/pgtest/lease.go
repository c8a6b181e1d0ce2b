package pgtest

import (
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// WaitLapsed polls c.Inspect until key exists and is not held, as the server
// evaluates lazy expiry with whatever clock it has, and returns that state.
// It fails the test when within passes first.
func WaitLapsed(t testing.TB, c *lease.Client, key string, within time.Duration) lease.State {
	t.Helper()
	var s lease.State
	Eventually(t, within, key+" to lapse on the server", func() bool {
		var err error
		if s, err = c.Inspect(Context(t, time.Minute), key); err != nil {
			t.Fatal(err)
		}
		return s.Exists && !s.Held
	})
	return s
}

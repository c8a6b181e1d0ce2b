// Package hardening tests pg_lease against hostile roles and load: install
// and update paths that another role's planted functions cannot hijack,
// registrations of live waiters that no clean-up removes, and free keys that
// are granted under any concurrency of first grants.
package hardening

import (
	"testing"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

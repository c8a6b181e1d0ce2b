package pgtest

import "github.com/pglease/pg_lease/internal/pgserver"

// The supervisor lives in internal/pgserver (no testing, no goleak: programs
// link it); these names keep the tests' spelling.

type (
	// Server is pgserver.Server.
	Server = pgserver.Server
	// Options is pgserver.Options.
	Options = pgserver.Options
)

const (
	// Superuser is pgserver.Superuser.
	Superuser = pgserver.Superuser
	// EnvTestDSN is pgserver.EnvTestDSN.
	EnvTestDSN = pgserver.EnvTestDSN
)

// ErrNeedsThrowaway is pgserver.ErrNeedsThrowaway.
var ErrNeedsThrowaway = pgserver.ErrNeedsThrowaway

var (
	// Start is pgserver.Start.
	Start = pgserver.Start
	// External is pgserver.External.
	External = pgserver.External
	// WithUser is pgserver.WithUser.
	WithUser = pgserver.WithUser
	// FindBinDir is pgserver.FindBinDir.
	FindBinDir = pgserver.FindBinDir
	// CloseShared is pgserver.CloseShared.
	CloseShared = pgserver.CloseShared
)

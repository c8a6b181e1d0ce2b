// Package pgtest is the testing layer over internal/pgserver (which runs the
// throwaway PostgreSQL servers and links no testing): servers and databases
// bound to a test's lifetime, Main with a goroutine-leak check, and the
// helpers the suites share.
//
// In a test that needs a database of its own but no control over the
// server, take a fresh database on the test binary's shared server:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) } // closes the shared server, runs goleak
//
//	func TestSomething(t *testing.T) {
//		pool := pgtest.NewLeasePool(t) // fresh database with pg_lease, dropped at cleanup
//		ctx := pgtest.Context(t, time.Minute)
//		...
//	}
//
// Waiting: Eventually(t, d, what, cond) polls a condition; WaitServerPast(t,
// q, ts) sleeps on the server until its clock has passed ts; a package that
// starts servers of its own bounds them with NewSlots(n) and Slots.Take.
//
// When PGLEASE_TEST_DSN is set (a role with CREATEDB), Shared and NewDatabase
// use that server instead of starting one.
//
// A test that crashes, stops, freezes the server or moves its clock starts
// one of its own, closed at cleanup (New fails the test, never skips, when
// no server can be started; when the test failed, the end of the server log
// is logged):
//
//	s := pgtest.New(t, pgtest.Options{FakeClock: true, Settings: map[string]string{"fsync": "off"}})
//	s.Kill(); s.Start(ctx); s.Freeze(); s.Thaw(); s.SetClockOffset(d)
//
// Streaming replication on loopback: NewStandby(t, primary, opts) makes a
// standby with pg_basebackup -R; then primary.SetSynchronousStandbyNames,
// standby.StopStreaming (its WAL is cut off: what the primary writes next
// is never replayed), primary.WaitReplayed(ctx, standby), primary.Kill(),
// standby.Promote(ctx) (pg_ctl promote) or PromoteSQL (pg_promote()),
// standby.EndWithoutPromotion(ctx) (restarted without standby.signal: a
// primary on the same timeline), and
// MultiHostDSN(db, servers...) for clients that follow the primary
// (target_session_attrs=read-write). test/failover uses them.
//
// Server, Options, Start and the other supervisor names are aliases of
// internal/pgserver's; see that package for what a throwaway server is.
package pgtest

// Package failure is pg_lease's failure suite: one Go test per item of the
// failure model (specs/FAILURE-MODEL.md), each on real throwaway PostgreSQL
// servers of its own (internal/pgtest) that it stops, crashes, freezes,
// exhausts or moves the clock of. The package has no code outside its tests
// (its hung holder is the candidate program of internal/testprog/candidate).
//
// Every test can be run against a deliberately broken pg_lease, to show that
// it fails when the property it claims is broken:
//
//	PGLEASE_FAILURE_BREAK=<name> go test ./test/failure -run <Test>
//
// installs, in each test database, the repository's install script with the
// named break applied (as a plain schema, without touching the server's
// extension directory). The breaks and the failures they cause are listed in
// README.md. PGLEASE_FAILURE_SQL=<file> installs that script instead of the
// repository's, the same way (hack/defects.sh, docs/audit/defects.md).
package failure

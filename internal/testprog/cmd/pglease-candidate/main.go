// Command pglease-candidate is the test suites' candidate process (see
// internal/testprog/candidate for its configuration and output).
package main

import "github.com/pglease/pg_lease/internal/testprog/candidate"

func main() { candidate.Main() }

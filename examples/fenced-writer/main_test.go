package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStaleWriterRejected runs the example against a fresh lease database
// and a separate store database and checks its whole output.
func TestStaleWriterRejected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, storeDSN := pgtest.NewLeaseDatabase(t), pgtest.NewDatabase(t)

	var out strings.Builder
	if err := run(ctx, &out, dsn, storeDSN, "report"); err != nil {
		t.Fatal(err)
	}
	want := `A acquired report with epoch 1
A writes with epoch 1: accepted
A pauses past its TTL (GC pause, SIGSTOP, partition): no renewal
B took report over with epoch 2
B writes with epoch 2: accepted
A resumes, still believing it leads, and writes with epoch 1: rejected: fence: write to "report" with epoch 1 rejected: epoch 2 already accepted
A's write in the lease database (fence.InTx): rejected: fence: fence "report" (owner "A", epoch 1): lease: lapsed
the store holds report written by B@2
`
	if got := out.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

// TestNoDSN: without a database the example says what to pass.
func TestNoDSN(t *testing.T) {
	err := mainErr(context.Background(), "", "")
	if err == nil || !strings.Contains(err.Error(), "-dsn") {
		t.Fatalf("mainErr without a DSN: %v", err)
	}
}

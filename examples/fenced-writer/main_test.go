package main

import (
	"context"
	"os"
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
	want, err := os.ReadFile("testdata/story.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != string(want) {
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

package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// status shows the promotion mode, the grace a promotion would impose, and
// the grace in force with its end, as text and as JSON.
func TestStatusShowsTheGrace(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	conn, c := connect(t, ctx, dsn)
	if err := leaseadmin.InstallSchema(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT lease.configure(max_ttl => '30s')"); err != nil {
		t.Fatal(err)
	}
	out, _ := wantExit(t, ctx, dsnEnv(dsn), 0, "status")
	for _, want := range []string{"max_ttl:          30s\n", "promotion:        any\n", "promotion grace:  30s ", "grace:            none in force\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status before a promotion: %q lacks %q", out, want)
		}
	}
	// A promotion, as the SQL sees one, recorded by a grant path.
	// (A promotion requests a checkpoint at once: the grace runs from it.)
	for _, q := range []string{"UPDATE lease.timeline_state SET timeline = 0",
		"UPDATE lease.leases SET life = life - interval '1 day'", "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := c.Acquire(ctx, "k", "o", time.Second)
	var ge *lease.GraceError
	if !errors.As(err, &ge) {
		t.Fatalf("acquire after the promotion: %v, want a GraceError", err)
	}
	out, _ = wantExit(t, ctx, dsnEnv(dsn), 0, "status")
	if want := "grace:            no new grant until " + ge.Until.UTC().Format(time.RFC3339Nano); !strings.Contains(out, want) {
		t.Fatalf("status during the grace: %q lacks %q", out, want)
	}
	out, _ = wantExit(t, ctx, dsnEnv(dsn), 0, "status", "-o", "json")
	var r struct {
		Promotion  string     `json:"promotion"`
		GraceUntil *time.Time `json:"grace_until"`
		GraceLeft  float64    `json:"grace_left_seconds"`
		Era        int64      `json:"era"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("status -o json: %v: %q", err, out)
	}
	if r.Promotion != "any" || r.GraceUntil == nil || !r.GraceUntil.Equal(ge.Until) || r.GraceLeft <= 0 || r.Era != 1 {
		t.Fatalf("status -o json during the grace: %+v", r)
	}
	if _, err := conn.Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
		t.Fatal(err)
	}
	out, _ = wantExit(t, ctx, dsnEnv(dsn), 0, "status")
	if !strings.Contains(out, "promotion:        synchronous\n") {
		t.Fatalf("status after configure(promotion => synchronous): %q", out)
	}
}

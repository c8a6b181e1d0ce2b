package pgserver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplication: a standby made with pg_basebackup -R streams from the
// primary, is read-only, loses what the primary wrote after StopStreaming,
// and after promotion accepts writes on a new timeline while the old
// primary (split brain) still runs; a synchronous standby makes commits
// wait for it; a multi-host read-write DSN reaches whichever is primary.
func TestReplication(t *testing.T) {
	ctx := ctxFor(t)
	p := newServer(t)
	st, err := p.StartStandby(ctx, StandbyOptions{Name: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if st.StandbyName() != "s1" {
		t.Fatalf("StandbyName = %q", st.StandbyName())
	}
	pc := connect(t, p.DSN())
	exec1(t, pc, "CREATE TABLE t (x int)")
	exec1(t, pc, "INSERT INTO t VALUES (1)")
	if err := p.WaitReplayed(ctx, st); err != nil {
		t.Fatal(err)
	}
	sc := connect(t, st.DSN())
	var n int
	if err := sc.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("standby: %d rows, %v", n, err)
	}
	if _, err := sc.Exec(ctx, "INSERT INTO t VALUES (2)"); err == nil || !strings.Contains(err.Error(), "25006") {
		t.Fatalf("write on the standby: %v (want 25006)", err)
	}
	if rec, err := st.InRecovery(ctx); err != nil || !rec {
		t.Fatalf("standby InRecovery = %t, %v", rec, err)
	}

	// Synchronous: with the standby cut off, a commit waits.
	if err := p.SetSynchronousStandbyNames(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	exec1(t, pc, "INSERT INTO t VALUES (3)") // the standby confirms
	if err := st.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = connect(t, p.DSN()).Exec(wctx, "INSERT INTO t VALUES (4)")
	cancel()
	if err == nil {
		t.Fatal("a synchronous commit returned with its only standby cut off")
	}
	if err := p.SetSynchronousStandbyNames(ctx, ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, pc, "INSERT INTO t VALUES (5)") // asynchronous: not on the standby

	tl1, err := p.Timeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	tl2, err := st.Timeline(ctx)
	if err != nil || tl2 <= tl1 {
		t.Fatalf("timeline after promotion %d (%v), before %d", tl2, err, tl1)
	}
	sc2 := connect(t, st.DSN())
	if err := sc2.QueryRow(ctx, "SELECT count(*) FROM t WHERE x IN (1, 3)").Scan(&n); err != nil || n != 2 {
		t.Fatalf("promoted standby: %d of the rows 1, 3; %v", n, err)
	}
	if err := sc2.QueryRow(ctx, "SELECT count(*) FROM t WHERE x = 5").Scan(&n); err != nil || n != 0 {
		t.Fatalf("promoted standby has the row written after StopStreaming: %d, %v", n, err)
	}
	exec1(t, sc2, "INSERT INTO t VALUES (6)")
	exec1(t, pc, "INSERT INTO t VALUES (7)") // split brain: both accept writes

	// Multi-host: the first read-write server in the list.
	for _, order := range [][]*Server{{p, st}, {st, p}} {
		c := connect(t, MultiHostDSN("postgres", order...))
		var port int
		if err := c.QueryRow(ctx, "SELECT current_setting('port')::int").Scan(&port); err != nil || port != order[0].Port() {
			t.Fatalf("multi-host DSN reached port %d (%v), want the first writable %d", port, err, order[0].Port())
		}
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	c := connect(t, MultiHostDSN("postgres", p, st))
	var port int
	if err := c.QueryRow(ctx, "SELECT current_setting('port')::int").Scan(&port); err != nil || port != st.Port() {
		t.Fatalf("with the old primary killed, the multi-host DSN reached %d (%v), want %d", port, err, st.Port())
	}

	// pg_promote() on a second standby of the new primary.
	st2, err := st.StartStandby(ctx, StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st2.Close() })
	if err := st2.PromoteSQL(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, st2.DSN()).Exec(ctx, "INSERT INTO t VALUES (8)"); err != nil {
		t.Fatal(err)
	}
}

// TestReplicationWithoutBasebackup: an installation with only initdb,
// pg_ctl and postgres (the npm-packaged servers) gets its standby from a
// copy of the stopped primary.
func TestReplicationWithoutBasebackup(t *testing.T) {
	real, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if os.Geteuid() == 0 {
		for _, d := range []string{bin, filepath.Dir(bin)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, name := range []string{"initdb", "postgres", "pg_ctl"} {
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxFor(t)
	p := newServer(t, Options{BinDir: bin})
	exec1(t, connect(t, p.DSN()), "CREATE TABLE t (x int)")
	st, err := p.StartStandby(ctx, StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	exec1(t, connect(t, p.DSN()), "INSERT INTO t VALUES (1)")
	if err := p.WaitReplayed(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := connect(t, st.DSN()).QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("promoted copy: %d rows, %v", n, err)
	}
}

package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/shard"
)

// TestShards: pglease shards lists the live members, what each owns and is
// assigned, and every shard: owned by its assigned member, moving (held by
// another process, here one that left), or unowned (never acquired, or
// released).
func TestShards(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	members := []string{"r1", "r2"}
	for _, m := range members {
		acquire(t, ctx, c, shard.MemberKey("ctl", m), m, time.Minute)
	}
	acquire(t, ctx, c, shard.MemberKey("other", "r9"), "r9", time.Minute) // another controller's member
	// shard 0 with its assigned member, shard 1 with a process that is no
	// member (it left: moving), shard 2 released, shard 3 never acquired.
	first := shard.Assign(4, members)[0]
	assign := shard.Balance(4, members, []string{first, "", "", ""})
	acquire(t, ctx, c, shard.Key("ctl", 0), assign[0], time.Minute)
	wrong := "r3-gone"
	acquire(t, ctx, c, shard.Key("ctl", 1), wrong, time.Minute)
	g := acquire(t, ctx, c, shard.Key("ctl", 2), assign[2], time.Minute)
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, ctx, e, "shards", "ctl", "--shards", "4")
	if !strings.Contains(out, "controller ctl: 4 shards, 2 members, 2 unowned, 1 moving") {
		t.Errorf("summary:\n%s", out)
	}
	for s, want := range []string{
		`0\s+owned\s+` + assign[0] + `\s+1\s+\S+\s+` + assign[0],
		`1\s+moving\s+` + wrong + `\s+1\s+\S+\s+` + assign[1],
		`2\s+unowned\s+-\s+2\s+-\s+` + assign[2],
		`3\s+unowned\s+-\s+0\s+-\s+` + assign[3],
	} {
		if !regexp.MustCompile(`(?m)^` + want + `\s*$`).MatchString(out) {
			t.Errorf("shard %d: no line matching %q in:\n%s", s, want, out)
		}
	}
	if strings.Contains(out, "r9") {
		t.Errorf("another controller's member listed:\n%s", out)
	}
	// Without --shards, N is the highest shard key seen plus one (3 here).
	if out := mustRun(t, ctx, e, "shards", "ctl"); !strings.Contains(out, "controller ctl: 3 shards") {
		t.Errorf("inferred N:\n%s", out)
	}
	wantExit(t, ctx, e, exitUsage, "shards", "ctl", "--shards", "-1")
	wantExit(t, ctx, e, exitUsage, "shards")
}

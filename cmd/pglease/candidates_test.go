package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
)

// pglease candidates KEY: the strategy, then the candidates in the order the
// strategy would choose them; a candidate that cannot be chosen has no rank.
func TestCandidates(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	if out := mustRun(t, ctx, e, "candidates", "job"); out != "job: strategy any\nRANK   CANDIDATE   VERSION   PRIORITY   READY   LIVE   REGISTERED\n" {
		t.Fatalf("candidates of a key without any: %q", out)
	}
	if _, err := handover.SetStrategy(ctx, c, "job", handover.StrategyNewestVersion); err != nil {
		t.Fatal(err)
	}
	for _, cand := range []handover.Candidate{
		{Owner: "pod-a", Version: "1.4.0", Ready: true, TTL: time.Minute},
		{Owner: "pod-b", Version: "v1.5.0", Ready: true, TTL: time.Minute},
		{Owner: "pod-c", Version: "1.6.0", Ready: false, TTL: time.Minute},
	} {
		if _, err := handover.Register(ctx, c, "job", cand); err != nil {
			t.Fatal(err)
		}
	}
	rows := tableRows(mustRun(t, ctx, e, "candidates", "job"))
	var got []string
	for _, r := range rows[2:] {
		got = append(got, strings.Join(r[:6], " "))
	}
	want := []string{"1 pod-b v1.5.0 0 true true", "2 pod-a 1.4.0 0 true true", "- pod-c 1.6.0 0 false true"}
	if strings.Join(rows[0], " ") != "job: strategy newest_version" || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("candidates table: %q", rows)
	}
	if out := mustRun(t, ctx, e, "candidates", "job", "-o", "name"); out != "pod-b\npod-a\npod-c\n" {
		t.Fatalf("-o name: %q", out)
	}
	var v struct {
		Strategy   string         `json:"strategy"`
		Candidates []candidateRow `json:"candidates"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, ctx, e, "candidates", "job", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.Strategy != "newest_version" || len(v.Candidates) != 3 || v.Candidates[0].Rank != 1 || v.Candidates[2].Rank != 0 || v.Candidates[2].Ready {
		t.Fatalf("-o json: %+v", v)
	}
	wantExit(t, ctx, e, exitUsage, "candidates")
	wantExit(t, ctx, e, exitUsage, "candidates", "job", "-o", "wide")
}

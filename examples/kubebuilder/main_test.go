package main

import (
	"os"
	"strings"
	"testing"
)

// The switch from the kubebuilder scaffold (testdata/scaffold_main.go.txt)
// to pg_lease changes at most 5 lines (README.md shows the diff).
func TestScaffoldDiff(t *testing.T) {
	before, err := os.ReadFile("testdata/scaffold_main.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	removed, added := lineDiff(strings.Split(string(before), "\n"), strings.Split(string(after), "\n"))
	t.Logf("removed %q\nadded %q", removed, added)
	if changed := max(len(removed), len(added)); changed > 5 {
		t.Errorf("%d lines changed (removed %d, added %d), want at most 5", changed, len(removed), len(added))
	}
	for _, want := range []string{"pgle.BindFlags(flag.CommandLine)", "le.NewManager(ctrl.GetConfigOrDie()"} {
		found := false
		for _, l := range added {
			found = found || strings.Contains(l, want)
		}
		if !found {
			t.Errorf("the switch does not add %q", want)
		}
	}
}

// lineDiff returns the lines only in a and only in b (longest common
// subsequence).
func lineDiff(a, b []string) (onlyA, onlyB []string) {
	n, m := len(a), len(b)
	l := make([][]int, n+1)
	for i := range l {
		l[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				l[i][j] = l[i+1][j+1] + 1
			} else {
				l[i][j] = max(l[i+1][j], l[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case a[i] == b[j]:
			i, j = i+1, j+1
		case l[i+1][j] >= l[i][j+1]:
			onlyA = append(onlyA, a[i])
			i++
		default:
			onlyB = append(onlyB, b[j])
			j++
		}
	}
	return append(onlyA, a[i:]...), append(onlyB, b[j:]...)
}

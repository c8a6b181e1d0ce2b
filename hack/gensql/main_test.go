package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerated: every committed update script to the current version is
// what gensql writes, and no other update script to it exists.
func TestGenerated(t *testing.T) {
	dir := filepath.Join("..", "..", "sql")
	want, err := generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("gensql generated no update script")
	}
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v (run: go run ./hack/gensql)", name, err)
			continue
		}
		if string(got) != string(w) {
			t.Errorf("sql/%s differs from what hack/gensql writes: edit sql/update/ or the full script, then run go run ./hack/gensql", name)
		}
	}
	// The current version: the one every generated script ends in.
	var version string
	for name := range want {
		version = strings.TrimSuffix(name[strings.LastIndex(name, "--")+2:], ".sql")
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "pg_lease--*--"+version+".sql"))
	for _, m := range matches {
		if _, ok := want[filepath.Base(m)]; !ok {
			t.Errorf("%s: an update script to %s that gensql does not write", m, version)
		}
	}
}

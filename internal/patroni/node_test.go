package patroni

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Patroni splits the pre_promote command as a shell would (Python's
// shlex.split): a cluster directory with a space still names the script.
func TestPrePromoteCommandNamesTheScript(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("no python3 on PATH to split the command as Patroni does: install python3 (Debian's patroni package depends on it; make test installs it)")
	}
	c := &Cluster{opts: Options{Nodes: 2, psql: "psql"}}
	n := &Node{c: c, Name: nodeName(0), dir: filepath.Join(t.TempDir(), "a dir 'quoted'", nodeName(0))}
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := n.writeConfig(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(n.cfgPath())
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		PostgreSQL struct {
			PrePromote string `json:"pre_promote"`
		} `json:"postgresql"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "-c", "import json, shlex, sys; print(json.dumps(shlex.split(sys.argv[1])))", cfg.PostgreSQL.PrePromote).Output()
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	if err := json.Unmarshal(out, &args); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(n.dir, "pre_promote.sh")
	if len(args) != 1 || args[0] != want {
		t.Fatalf("Patroni runs %q, want [%q]", args, want)
	}
}

package pgtest

import (
	"os"
	"strings"
	"testing"
)

// ScriptFile reads the SQL script at path (named by the environment
// variable env, which the failure message names) for a plain-schema
// install: psql meta-command lines (\echo guards) dropped, @extowner@
// replaced by the superuser.
func ScriptFile(t testing.TB, path, env string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	var sb strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), `\`) {
			sb.WriteString(l)
		}
	}
	return strings.ReplaceAll(sb.String(), "@extowner@", `"`+Superuser+`"`)
}

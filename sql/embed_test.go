package pgleasesql_test

import (
	"strings"
	"testing"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

func TestSchemaScript(t *testing.T) {
	s, err := pgleasesql.SchemaScript(`we"ird role`, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`\echo`, `\quit`, `@extowner@`, `@extschema@`} {
		if strings.Contains(s, bad) {
			t.Errorf("script contains %q", bad)
		}
	}
	if !strings.Contains(s, `OWNER TO "we""ird role";`) {
		t.Error("owner not quoted as an identifier")
	}
	if !strings.Contains(s, "schema-only install") {
		t.Error("no COMMENT marking the schema-only install")
	}
	if _, err := pgleasesql.SchemaScript("", ""); err == nil {
		t.Error("empty owner accepted")
	}
	// From the base version: the update scripts only, not the base script.
	up, err := pgleasesql.SchemaScript("o", pgleasesql.BaseVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(up) >= len(s) {
		t.Errorf("update script from %s (%d bytes) not shorter than the full install (%d)", pgleasesql.BaseVersion, len(up), len(s))
	}
	if _, err := pgleasesql.SchemaScript("o", "9.9.9"); err == nil {
		t.Error("no error from an unknown version")
	}
}

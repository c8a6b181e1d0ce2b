package pgleasesql_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

// TestPGXNMeta checks META.json against the PGXN Meta Spec 1.0.0: the
// required keys, semantic versions, a license the spec names, and that it
// describes the files this folder ships (the version of pg_lease.control and
// its full install script). The folder is the PGXN distribution: pgxn
// install runs its PGXS Makefile.
func TestPGXNMeta(t *testing.T) {
	b, err := os.ReadFile("META.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Name, Abstract, Version, License, ReleaseStatus string
		Maintainer                                      []string
		Provides                                        map[string]struct {
			File, Version, Abstract, Docfile string
		}
		Prereqs  map[string]map[string]map[string]string
		MetaSpec struct{ Version, URL string } `json:"meta-spec"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("META.json: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("META.json: required key %q missing", k)
		}
	}
	semver := regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	if m.Name != "pg_lease" || m.Abstract == "" || len(m.Maintainer) == 0 {
		t.Errorf("META.json: name %q, abstract %q, maintainer %v", m.Name, m.Abstract, m.Maintainer)
	}
	if m.Version != pgleasesql.Version || !semver.MatchString(m.Version) {
		t.Errorf("META.json: version %q, want %q (default_version)", m.Version, pgleasesql.Version)
	}
	licenses := []string{"agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd",
		"gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit", "mozilla_1_0",
		"mozilla_1_1", "openssl", "perl_5", "postgresql", "qpl_1_0", "ssleay", "sun", "zlib",
		"open_source", "restricted", "unrestricted", "unknown"}
	if !slices.Contains(licenses, m.License) {
		t.Errorf("META.json: license %q is not one the spec names", m.License)
	}
	if !slices.Contains([]string{"", "stable", "testing", "unstable"}, m.ReleaseStatus) {
		t.Errorf("META.json: release_status %q", m.ReleaseStatus)
	}
	if m.MetaSpec.Version != "1.0.0" {
		t.Errorf("META.json: meta-spec version %q, want 1.0.0", m.MetaSpec.Version)
	}
	p, ok := m.Provides["pg_lease"]
	if !ok || len(m.Provides) != 1 {
		t.Fatalf("META.json: provides %v, want exactly pg_lease", m.Provides)
	}
	if p.Version != pgleasesql.Version || p.File != "pg_lease--"+pgleasesql.Version+".sql" {
		t.Errorf("META.json: provides pg_lease %+v, want version %s in pg_lease--%[2]s.sql", p, pgleasesql.Version)
	}
	for _, f := range []string{p.File, "Makefile", "pg_lease.control"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("META.json names or needs %s: %v", f, err)
		}
	}
	if v := m.Prereqs["runtime"]["requires"]["PostgreSQL"]; !semver.MatchString(v) {
		t.Errorf("META.json: runtime PostgreSQL prerequisite %q", v)
	}
}

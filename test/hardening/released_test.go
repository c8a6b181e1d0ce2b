package hardening

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgserver"
	"github.com/pglease/pg_lease/internal/pgtest"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

// releasedSHA256 is the SHA-256 of every released script as its release
// shipped it.
var releasedSHA256 = map[string]string{
	"pg_lease--0.1.0.sql":        "46c3a11b4f8d0c33132b542939be362f435c8f0da23339e67106e9247c6c7e45",
	"pg_lease--0.1.0--0.2.0.sql": "f50dd984de39be3dbbd97b998a7bbfd32d662ae7a94e67f8017f01b04a72f9a8",
	"pg_lease--0.2.0--0.3.0.sql": "39ae5549ebf2abf50b41c1a7c6da693e910ecbbf0d7d206015c5bff194e03bea",
	"pg_lease--0.4.0.sql":        "2eb986a69e8723b3380a64dcb6b9afe275be1a82049d910ec55b1aa123b6b320",
	"pg_lease--0.1.0--0.4.0.sql": "100460fcb4d8ef1a151d53090f5fef8023629ff0349f8bc8ae173d10fa4f831e",
	"pg_lease--0.2.0--0.4.0.sql": "32b743a217c1af372b04c5a0b2d81b306f061b44f59efba2989f62ff38677753",
	"pg_lease--0.3.0--0.4.0.sql": "6f1d0b759851e4d7be9daf5ee35ace994f4e554f364c13fb1b97497d9d511478",
}

// addedPin is what the released scripts that did not pin search_path got
// after their release, right after their guard line, and nothing else.
const addedPin = "\n-- Added after the release, the only change to this script: search_path\n" +
	"-- pinned first, so that no statement below resolves a name in a schema\n" +
	"-- another role can create in. The extension command restores it afterwards.\n" +
	"SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);\n"

// pinnedAfterRelease are the released scripts that carry addedPin.
var pinnedAfterRelease = []string{"pg_lease--0.1.0.sql", "pg_lease--0.1.0--0.2.0.sql", "pg_lease--0.2.0--0.3.0.sql"}

// releasedTexts returns the text of each script in pinnedAfterRelease as
// released: the shipped text without addedPin, checked against
// releasedSHA256.
func releasedTexts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range pinnedAfterRelease {
		shipped := string(pgleasesql.Files()[name])
		guard := regexp.MustCompile(`(?m)^\\echo .*\\quit\n`).FindStringIndex(shipped)
		if guard == nil || !strings.HasPrefix(shipped[guard[1]:], addedPin) || strings.Count(shipped, addedPin) != 1 {
			t.Fatalf("%s: the pin added after the release is not right after the guard line, once", name)
		}
		orig := shipped[:guard[1]] + shipped[guard[1]+len(addedPin):]
		if sum := sha256.Sum256([]byte(orig)); hex.EncodeToString(sum[:]) != releasedSHA256[name] {
			t.Fatalf("%s: without the added pin, the text is not the released one: changed beyond the pin", name)
		}
		out[name] = orig
	}
	return out
}

// TestReleasedScriptsChangedOnlyByThePin: every released script is the
// released text, or (the three that did not pin search_path) the released
// text with the pin added first and nothing else.
func TestReleasedScriptsChangedOnlyByThePin(t *testing.T) {
	orig := releasedTexts(t)
	for name, want := range releasedSHA256 {
		if _, ok := orig[name]; ok {
			continue
		}
		b, ok := pgleasesql.Files()[name]
		if !ok {
			t.Errorf("%s: no longer shipped", name)
			continue
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != want {
			t.Errorf("%s: not the released text", name)
		}
	}
}

// TestReleasedScriptsPinChangesNoObject: the catalog that the released
// scripts make is the one that the same scripts with the added pin make.
// Both run as PostgreSQL runs them, through CREATE and ALTER EXTENSION, on a
// server with an extension directory of its own: first with the shipped
// files, then with the released texts in their place. Each path gets a
// fresh database: every version created by name, the update chain from
// 0.1.0 one release at a time, a trusted install by a database owner, and
// each then updated to the current version. The catalog is what the upgrade
// check compares (upgrade_catalog(): every member object's definition,
// owner, ACL and comment, tables' columns, constraints and indexes) and the
// extension's own row (version, owner, schema, configuration tables).
func TestReleasedScriptsPinChangesNoObject(t *testing.T) {
	orig := releasedTexts(t)
	ctx := pgtest.Context(t, 5*time.Minute)
	src := pgtest.Shared(t)
	if src.External() {
		src = pgtest.New(t)
	}
	layout, err := src.Layout(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pglease-install-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, extDir, err := pgserver.PrivateInstallation(dir, layout)
	if err != nil {
		t.Fatal(err)
	}
	srv := pgtest.New(t, pgtest.Options{BinDir: bin})
	if got, err := srv.ExtensionDir(ctx); err != nil || got != extDir {
		t.Fatalf("the private server's extension directory is %q (%v), want %q", got, err, extDir)
	}
	admin := pgtest.Connect(t, srv.DSN())
	defer admin.Close(ctx)
	exec(ctx, t, admin, `CREATE ROLE regress_pglease_released_owner LOGIN`)
	catalogFn := upgradeCatalogFunction(t)

	const create, update = "CREATE EXTENSION pg_lease VERSION '%s'", "ALTER EXTENSION pg_lease UPDATE TO '%s'"
	paths := []releasedPath{
		{name: "0.1.0", steps: []string{fmt.Sprintf(create, "0.1.0")}},
		{name: "0.2.0", steps: []string{fmt.Sprintf(create, "0.2.0")}},
		{name: "0.3.0", steps: []string{fmt.Sprintf(create, "0.3.0")}},
		{name: "0.1.0 updated to 0.2.0, 0.3.0", steps: []string{fmt.Sprintf(create, "0.1.0"),
			fmt.Sprintf(update, "0.2.0"), fmt.Sprintf(update, "0.3.0")}},
		{name: "0.1.0 by the database owner, updated to 0.3.0", owner: true, steps: []string{
			fmt.Sprintf(create, "0.1.0"), fmt.Sprintf(update, "0.3.0")}},
	}
	// catalogs[variant][path][step]: the catalog after each step.
	catalogs := map[string]map[string][][]string{}
	for _, variant := range []string{"shipped", "released"} {
		files := pgleasesql.Files()
		if variant == "released" {
			for name, text := range orig {
				files[name] = []byte(text)
			}
		}
		if err := pgserver.InstallFiles(extDir, files); err != nil {
			t.Fatal(err)
		}
		catalogs[variant] = map[string][][]string{}
		for _, p := range paths {
			dsn, err := srv.NewDatabase(ctx)
			if err != nil {
				t.Fatal(err)
			}
			su := pgtest.Connect(t, dsn)
			exec(ctx, t, su, catalogFn)
			exec(ctx, t, su, `ALTER DATABASE `+pgx.Identifier{su.Config().Database}.Sanitize()+` OWNER TO regress_pglease_released_owner`)
			exec(ctx, t, su, `GRANT CREATE ON SCHEMA public TO regress_pglease_released_owner`)
			first := su
			if p.owner {
				first = pgtest.Connect(t, pgtest.WithUser(dsn, "regress_pglease_released_owner"))
			}
			for i, step := range p.all() {
				c := su
				if i == 0 {
					c = first
				}
				exec(ctx, t, c, step)
				catalogs[variant][p.name] = append(catalogs[variant][p.name], catalogRows(ctx, t, su))
			}
			if first != su {
				first.Close(ctx)
			}
			su.Close(ctx)
		}
	}
	for _, p := range paths {
		shipped, released := catalogs["shipped"][p.name], catalogs["released"][p.name]
		for i, step := range p.all() {
			if len(shipped[i]) < 10 {
				t.Errorf("%s, after %s: only %d catalog entries: the query found nothing", p.name, step, len(shipped[i]))
			}
			if d := diffRows(shipped[i], released[i]); d != "" {
				t.Errorf("%s, after %s: the shipped scripts make another catalog than the released texts:\n%s", p.name, step, d)
			}
		}
	}
}

// releasedPath is a way to reach a released version: steps run in a fresh
// database, the first by the database owner when owner is set (a trusted
// install), the others by a superuser.
type releasedPath struct {
	name  string
	owner bool
	steps []string
}

// all is the path's steps, then the update to the current version.
func (p releasedPath) all() []string {
	return append(append([]string(nil), p.steps...), "ALTER EXTENSION pg_lease UPDATE")
}

// upgradeCatalogFunction returns the upgrade check's definition of
// upgrade_catalog() (sql/test/upgrade), which lists every member object of
// the extension with its full definition.
func upgradeCatalogFunction(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "sql", "test", "upgrade", "sql", "upgrade_04_update_0_3_0.sql"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)CREATE FUNCTION upgrade_catalog\(\).*?\n\$\$;\n`).Find(b)
	if m == nil {
		t.Fatal("no CREATE FUNCTION upgrade_catalog() in upgrade_04_update_0_3_0.sql")
	}
	return string(m)
}

// catalogRows returns the extension's catalog entries, sorted, and its row
// of pg_extension.
func catalogRows(ctx context.Context, t *testing.T, c *pgx.Conn) []string {
	t.Helper()
	rows, err := c.Query(ctx, `
		SELECT object || ': ' || definition FROM upgrade_catalog()
		UNION ALL
		SELECT 'extension ' || e.extversion || ' owner ' || e.extowner::regrole || ' schema ' || e.extnamespace::regnamespace
		       || ' relocatable ' || e.extrelocatable || ' config ' || coalesce(e.extconfig::regclass[]::text, '-')
		       || ' conditions ' || coalesce(e.extcondition::text, '-')
		  FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_lease'
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diffRows lists the entries of two sorted lists that only one has.
func diffRows(a, b []string) string {
	inB := map[string]int{}
	for _, s := range b {
		inB[s]++
	}
	var d strings.Builder
	for _, s := range a {
		if inB[s] > 0 {
			inB[s]--
			continue
		}
		fmt.Fprintf(&d, "  only shipped:  %.300s\n", s)
	}
	for _, s := range b {
		if inB[s] > 0 {
			inB[s]--
			fmt.Fprintf(&d, "  only released: %.300s\n", s)
		}
	}
	return d.String()
}

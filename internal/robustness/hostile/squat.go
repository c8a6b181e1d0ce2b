package hostile

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgserver"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// installerSchema is the installer's "$user" schema: first in its default
// search_path, and free for any role with CREATE on the database to take.
const installerSchema = pgserver.Superuser

// squatSQL creates schema SQUAT (owned by the creating role) with a
// sequence that counts every run of its functions, and functions an
// installer's unqualified calls could resolve to: overloads of format,
// quote_ident and lower that match the argument types better than
// pg_catalog's, and a version() that claims the current pg_lease version.
// Each raises a NOTICE naming the role it ran as.
const squatSQL = `
CREATE SCHEMA SQUAT;
GRANT USAGE ON SCHEMA SQUAT TO PUBLIC;
CREATE SEQUENCE SQUAT.squat_ran;
GRANT USAGE, SELECT, UPDATE ON SEQUENCE SQUAT.squat_ran TO PUBLIC;
CREATE FUNCTION SQUAT.squat_mark(what text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM pg_catalog.nextval('SQUAT.squat_ran');
  RAISE NOTICE 'squat: SQUAT.% ran as %', what, current_user;
END $f$;
CREATE FUNCTION SQUAT.format(text, text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('format'); RETURN pg_catalog.format($1, $2); END $f$;
CREATE FUNCTION SQUAT.format(text, text, text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('format'); RETURN pg_catalog.format($1, $2, $3); END $f$;
CREATE FUNCTION SQUAT.format(text, text, text, text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('format'); RETURN pg_catalog.format($1, $2, $3, $4); END $f$;
CREATE FUNCTION SQUAT.format(text, regclass) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('format'); RETURN pg_catalog.format($1, $2); END $f$;
CREATE FUNCTION SQUAT.format(text, regprocedure) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('format'); RETURN pg_catalog.format($1, $2); END $f$;
CREATE FUNCTION SQUAT.quote_ident(character varying) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('quote_ident'); RETURN pg_catalog.quote_ident($1); END $f$;
CREATE FUNCTION SQUAT.lower(character varying) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('lower'); RETURN pg_catalog.lower($1); END $f$;
CREATE FUNCTION SQUAT.version() RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM SQUAT.squat_mark('version'); RETURN 'VERSION'; END $f$;
`

func squatScript(schema string) string {
	return strings.NewReplacer("SQUAT", pgx.Identifier{schema}.Sanitize(), "VERSION", leaseadmin.Version).Replace(squatSQL)
}

// squatInstallerSchema: the creator role takes the installer's "$user"
// schema in the run's database.
func (a *actor) squatInstallerSchema(ctx context.Context) error {
	_, err := a.main.conn.Exec(ctx, squatScript(installerSchema))
	if err == nil {
		a.e.rec.Count("hostile: squatted schemas", 1)
	}
	return err
}

// The installer's actions on a database another role prepared.
const (
	squatSchemaOnly = "leaseadmin.InstallSchema over a squatted schema lease"
	squatExtension  = "leaseadmin.InstallExtension over a squatted schema lease"
	squatPin        = "CREATE EXTENSION pg_lease VERSION '0.1.0', then UPDATE TO '0.2.0', '0.3.0' and the default, with the installer's \"$user\" schema squatted"
	squatPlain      = "CREATE EXTENSION pg_lease with the installer's \"$user\" schema squatted"
)

// runSquats spreads the squatting scenarios over the run. In each,
// a fresh database where the creator role has CREATE is prepared by it,
// then the installer acts there as an operator would (check 9).
func (e *env) runSquats(ctx context.Context, seed int64) error {
	start := e.rec.Now()
	rnd := rand.New(rand.NewSource(seed))
	kinds := []string{squatSchemaOnly, squatExtension, squatPin, squatPlain}
	rnd.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	for i, kind := range kinds {
		at := start + e.cfg.Duration*time.Duration(i+1)/time.Duration(len(kinds)+1)
		if !sleep(ctx, at-e.rec.Now()) {
			return nil
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		e.logf("squat_%d: %s", i, kind)
		err := e.squat(sctx, kind, fmt.Sprintf("squat_%d", i))
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
	}
	return nil
}

// notices collects the NOTICEs a connection receives.
type notices struct {
	mu sync.Mutex
	l  []string
}

func (n *notices) add(_ *pgconn.PgConn, m *pgconn.Notice) {
	n.mu.Lock()
	n.l = append(n.l, m.Message)
	n.mu.Unlock()
}

func (n *notices) squats() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, m := range n.l {
		if strings.HasPrefix(m, "squat:") {
			out = append(out, m)
		}
	}
	return out
}

// installerConn connects as the installer to db with its default
// search_path, as an operator's session or an installing application has.
func (e *env) installerConn(ctx context.Context, db string, n *notices) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(e.srv.DatabaseDSN(db))
	if err != nil {
		return nil, err
	}
	cfg.OnNotice = n.add
	return pgx.ConnectConfig(ctx, cfg)
}

// pinnedConn connects as the installer to db with search_path pinned to
// pg_catalog: the harness's own reads.
func (e *env) pinnedConn(ctx context.Context, db string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(e.srv.DatabaseDSN(db))
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["search_path"] = "pg_catalog"
	return pgx.ConnectConfig(ctx, cfg)
}

func (e *env) squat(ctx context.Context, kind, db string) error {
	if _, err := e.srv.CreateDatabase(ctx, db); err != nil {
		return err
	}
	defer func() { _ = e.srv.DropDatabase(context.WithoutCancel(ctx), db) }()
	if _, err := e.admin.Exec(ctx, `GRANT CREATE ON DATABASE `+pgx.Identifier{db}.Sanitize()+` TO `+creatorRole); err != nil {
		return err
	}
	// The creator role prepares the database.
	mc, err := pgx.Connect(ctx, e.dsnOf(creatorRole, db))
	if err != nil {
		return err
	}
	schemas := []string{installerSchema}
	if kind == squatSchemaOnly || kind == squatExtension {
		schemas = append(schemas, "lease")
	}
	for _, s := range schemas {
		if _, err := mc.Exec(ctx, squatScript(s)); err != nil {
			mc.Close(ctx)
			return fmt.Errorf("squatting schema %s: %w", s, err)
		}
	}
	mc.Close(ctx)
	e.rec.Count("hostile: squatted schemas", len(schemas))

	// The installer acts.
	n := &notices{}
	ic, err := e.installerConn(ctx, db, n)
	if err != nil {
		return err
	}
	var steps []string
	var actErr error
	switch kind {
	case squatSchemaOnly:
		actErr = leaseadmin.InstallSchema(ctx, ic)
		steps = append(steps, "InstallSchema")
	case squatExtension:
		actErr = leaseadmin.InstallExtension(ctx, ic)
		steps = append(steps, "InstallExtension")
	case squatPlain:
		_, actErr = ic.Exec(ctx, `CREATE EXTENSION pg_lease`)
		steps = append(steps, "CREATE EXTENSION pg_lease")
	case squatPin:
		for _, stmt := range []string{`CREATE EXTENSION pg_lease VERSION '0.1.0'`, `ALTER EXTENSION pg_lease UPDATE TO '0.2.0'`,
			`ALTER EXTENSION pg_lease UPDATE TO '0.3.0'`, `ALTER EXTENSION pg_lease UPDATE`} {
			steps = append(steps, stmt)
			if _, actErr = ic.Exec(ctx, stmt); actErr != nil {
				break
			}
		}
	}
	// What an operator runs next: the version.
	_, _, verr := leaseadmin.Installed(ctx, ic)
	ic.Close(ctx)
	e.logf("squat %s: %s: %v (version: %v)", db, kind, actErr, verr)
	e.judgeSquat(ctx, db, kind, schemas, n, actErr, steps)
	return nil
}

// judgeSquat is check (9) after the installer acted on db: none of the
// squatter's functions ran (their counter, and the notices the installer
// received), and an install reported done left pg_lease's objects, and
// the schema the extension is recorded in, to the installer.
func (e *env) judgeSquat(ctx context.Context, db, kind string, schemas []string, n *notices, actErr error, steps []string) {
	pc, err := e.pinnedConn(ctx, db)
	if err != nil {
		e.rec.Count("errors: squat reads", 1)
		return
	}
	defer pc.Close(ctx)
	for _, s := range schemas {
		var ran bool
		if err := pc.QueryRow(ctx, `SELECT is_called FROM `+pgx.Identifier{s, "squat_ran"}.Sanitize()).Scan(&ran); err != nil {
			continue
		}
		if ran {
			e.rec.Violate(CheckInstaller, "%s: the installer (%s) ran functions %s created in schema %s; notices: %v",
				db, strings.Join(steps, "; "), creatorRole, s, n.squats())
		}
	}
	if actErr != nil {
		return
	}
	var nspOwner, extNsp, extNspOwner string
	var foreign []string
	err = pc.QueryRow(ctx, `SELECT coalesce((SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'lease'), ''),
	       coalesce((SELECT n.nspname FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace WHERE x.extname = 'pg_lease'), ''),
	       coalesce((SELECT pg_get_userbyid(n.nspowner) FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace WHERE x.extname = 'pg_lease'), ''),
	       coalesce((SELECT array_agg(DISTINCT p.proname::text || ' of ' || pg_get_userbyid(p.proowner))
	                   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	                  WHERE n.nspname = 'lease' AND pg_get_userbyid(p.proowner) <> $1), '{}')`, pgserver.Superuser).
		Scan(&nspOwner, &extNsp, &extNspOwner, &foreign)
	if err != nil {
		e.rec.Count("errors: squat reads", 1)
		return
	}
	if nspOwner != pgserver.Superuser || len(foreign) > 0 {
		e.rec.Violate(CheckInstaller, "%s: %s reported pg_lease installed, but schema lease belongs to %q and holds other roles' functions %v",
			db, strings.Join(steps, "; "), nspOwner, foreign)
	}
	if extNspOwner != "" && extNspOwner != pgserver.Superuser {
		e.rec.Violate(CheckInstaller, "%s: %s recorded the extension in schema %s, which %s owns%s",
			db, strings.Join(steps, "; "), extNsp, extNspOwner, e.dropByOwner(ctx, db, extNsp, extNspOwner, pc))
	}
}

// dropByOwner: the owner of the schema the extension is recorded in drops
// that schema with CASCADE; it says what that took with it.
func (e *env) dropByOwner(ctx context.Context, db, schema, owner string, pc *pgx.Conn) string {
	oc, err := pgx.Connect(ctx, e.dsnOf(owner, db))
	if err != nil {
		return ""
	}
	defer oc.Close(ctx)
	if _, err := oc.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Sprintf("; its DROP SCHEMA %s CASCADE failed: %v", schema, err)
	}
	var ext, nsp bool
	if err := pc.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_lease'),
	       EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'lease')`).Scan(&ext, &nsp); err != nil {
		return ""
	}
	if !ext && !nsp {
		return fmt.Sprintf(": %s's DROP SCHEMA %s CASCADE dropped pg_lease, schema lease and every lease with it", owner, schema)
	}
	return fmt.Sprintf("; after %s's DROP SCHEMA %s CASCADE, pg_lease is there: %v, schema lease: %v", owner, schema, ext, nsp)
}

// installerCalls: at the end, the installer runs in the run's database
// what an operator and an installing application run, with its default
// search_path; none may run the creator role's functions in the
// installer's "$user" schema.
func (e *env) installerCalls(ctx context.Context) {
	n := &notices{}
	ic, err := e.installerConn(ctx, database, n)
	if err != nil {
		e.rec.Count("errors: installer calls", 1)
		return
	}
	c := lease.New(ic)
	var errs []error
	_, _, err = leaseadmin.Installed(ctx, ic)
	errs = append(errs, err)
	errs = append(errs, leaseadmin.InstallExtension(ctx, ic), leaseadmin.InstallSchema(ctx, ic))
	_, err = leaseadmin.History(ctx, c, electorKey, 10)
	errs = append(errs, err)
	_, err = leaseadmin.Health(ctx, c, time.Hour)
	errs = append(errs, err)
	_, err = leaseadmin.ReadSettings(ctx, c)
	errs = append(errs, err)
	_, _, err = leaseadmin.Cleanup(ctx, c, time.Hour, 100)
	errs = append(errs, err)
	ic.Close(ctx)
	if err := errors.Join(errs...); err != nil {
		e.logf("installer calls: %v", err)
	}
	pc, err := e.pinnedConn(ctx, database)
	if err != nil {
		return
	}
	defer pc.Close(ctx)
	var ran bool
	if err := pc.QueryRow(ctx, `SELECT is_called FROM `+pgx.Identifier{installerSchema, "squat_ran"}.Sanitize()).Scan(&ran); err == nil && ran {
		e.rec.Violate(CheckInstaller, "%s: the installer's calls (Installed, InstallExtension, InstallSchema, History, Health, ReadSettings, Cleanup) ran functions %s created in schema %s; notices: %v",
			database, creatorRole, installerSchema, n.squats())
	}
}

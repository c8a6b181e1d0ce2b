package leaseadmin

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
)

// ErrSquatted: schema lease is not a pg_lease install the current role can
// trust. Either it is not pg_lease's (a schema named lease that the
// extension did not create, or one without the lease.version() pg_lease
// writes), or it or an object in it belongs to a role that cannot already
// act as the current role, or such a role may create objects in it. Nothing
// in the schema was called. The error's text names the schema's owner and
// the object at fault.
var ErrSquatted = errors.New("lease: schema lease is not a pg_lease install this role can trust")

// Installation is what the catalogs say of the pg_lease in a database.
// Describe reads it without calling any function of schema lease.
type Installation struct {
	// Version is the installed version: the extension's (pg_extension), or
	// for a schema-only install the literal that lease.version() returns,
	// read from its source.
	Version string
	// Extension is true when pg_lease was installed by CREATE EXTENSION.
	Extension bool
	// Owner is the role that owns schema lease.
	Owner string
	// Trusted is true when the schema and every function, relation, type
	// and operator in it belong to roles that can already act as the
	// current role (the role itself, a superuser, or a role that is a member
	// of it), and no other role may create objects in the schema. Calling
	// pg_lease's functions then runs no code that a role without the
	// current role's privileges could have written. InstallExtension,
	// InstallSchema, Cleanup and ForceRelease call nothing unless it is.
	Trusted bool

	role   string // the current role
	reason string // why the install is not trusted ("" when it is)
}

// objectsSQL lists every object of the schema $1, the schema itself first:
// kind, name, owner, whether the owner can act as the current role, and
// whether it belongs to the extension $2.
const objectsSQL = `
SELECT o.kind, o.name, pg_catalog.pg_get_userbyid(o.owner),
       pg_catalog.pg_has_role(o.owner, CURRENT_USER, 'MEMBER'),
       EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                WHERE d.classid OPERATOR(pg_catalog.=) o.classid AND d.objid OPERATOR(pg_catalog.=) o.oid
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) $2::pg_catalog.oid
                  AND d.deptype OPERATOR(pg_catalog.=) 'e')
  FROM (SELECT 0 AS ord, 'schema' AS kind, 'lease'::pg_catalog.text AS name,
               'pg_catalog.pg_namespace'::pg_catalog.regclass AS classid, n.oid, n.nspowner AS owner
          FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
        UNION ALL
        SELECT 1, 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text,
               'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner
          FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) $1::pg_catalog.oid
        UNION ALL
        SELECT 2, 'relation', c.oid::pg_catalog.regclass::pg_catalog.text,
               'pg_catalog.pg_class'::pg_catalog.regclass, c.oid, c.relowner
          FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.oid
        UNION ALL
        SELECT 3, 'type', t.oid::pg_catalog.regtype::pg_catalog.text,
               'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner
          FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.oid
        UNION ALL
        SELECT 4, 'operator', o.oid::pg_catalog.regoperator::pg_catalog.text,
               'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, o.oprowner
          FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.oid) o
 ORDER BY o.ord, o.name`

// Describe reads from the catalogs which pg_lease is installed in the
// database q is connected to, who owns it, and whether the current role can
// trust it (Installation.Trusted). It calls no function and reads no object
// of schema lease, and names every catalog object and operator in full, so
// the caller's search_path does not matter. It returns an error matching
// lease.ErrNotInstalled when there is neither the extension nor a schema
// lease, and ErrSquatted when schema lease is not pg_lease's.
func Describe(ctx context.Context, q lease.Querier) (Installation, error) {
	var (
		in         Installation
		extVersion *string
		extOID     *uint32
		nspOID     *uint32
		owner      *string
	)
	err := q.QueryRow(ctx, `SELECT
		  (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'pg_lease'),
		  (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'pg_lease'),
		  (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'),
		  (SELECT pg_catalog.pg_get_userbyid(n.nspowner) FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'),
		  CURRENT_USER::pg_catalog.text`).Scan(&extVersion, &extOID, &nspOID, &owner, &in.role)
	if err != nil {
		return Installation{}, fmt.Errorf("lease: reading the installed version: %w", err)
	}
	switch {
	case nspOID == nil && extVersion == nil:
		return Installation{}, lease.ErrNotInstalled
	case nspOID == nil:
		return Installation{}, fmt.Errorf("%w: the pg_lease extension is installed but schema lease is missing", ErrSquatted)
	}
	in.Owner = *owner
	if extVersion != nil {
		in.Version, in.Extension = *extVersion, true
	}

	// Every object of the schema, the schema itself first: its owner, whether
	// that owner can act as the current role, and whether it belongs to the
	// extension.
	var ext uint32
	if extOID != nil {
		ext = *extOID
	}
	rows, err := q.Query(ctx, objectsSQL, *nspOID, ext)
	if err != nil {
		return Installation{}, fmt.Errorf("lease: reading schema lease: %w", err)
	}
	var notMember, untrusted string
	for rows.Next() {
		var kind, name, objOwner string
		var trusted, member bool
		if err := rows.Scan(&kind, &name, &objOwner, &trusted, &member); err != nil {
			rows.Close()
			return Installation{}, fmt.Errorf("lease: reading schema lease: %w", err)
		}
		if in.Extension && !member && notMember == "" && (kind == "schema" || kind == "function") {
			notMember = fmt.Sprintf("%s %s (owner %s) does not belong to the pg_lease extension", kind, name, quoteRole(objOwner))
		}
		if !trusted && untrusted == "" {
			untrusted = fmt.Sprintf("%s %s belongs to role %s, which cannot act as role %s", kind, name, quoteRole(objOwner), quoteRole(in.role))
		}
	}
	if err := rows.Err(); err != nil {
		return Installation{}, fmt.Errorf("lease: reading schema lease: %w", err)
	}
	if notMember != "" {
		return Installation{}, fmt.Errorf("%w: %s; nothing in it was run", ErrSquatted, notMember)
	}

	// Roles other than trusted ones that may create objects in the schema.
	if untrusted == "" {
		var grantee *string
		err := q.QueryRow(ctx, `
SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END
  FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
 WHERE n.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
   AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
   AND (a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
        OR NOT pg_catalog.pg_has_role(a.grantee, CURRENT_USER, 'MEMBER'))
 LIMIT 1`, *nspOID).Scan(&grantee)
		switch {
		case err == nil && grantee != nil:
			untrusted = fmt.Sprintf("role %s may create objects in schema lease and cannot act as role %s", quoteRole(*grantee), quoteRole(in.role))
		case err != nil && !isNoRows(err):
			return Installation{}, fmt.Errorf("lease: reading schema lease: %w", err)
		}
	}
	in.Trusted, in.reason = untrusted == "", untrusted

	if !in.Extension {
		v, err := schemaVersion(ctx, q, *nspOID)
		if err != nil {
			return Installation{}, err
		}
		if v == "" {
			return Installation{}, fmt.Errorf("%w: schema lease (owner %s) is not pg_lease's: it has no lease.version() as pg_lease writes it; nothing in it was run",
				ErrSquatted, quoteRole(in.Owner))
		}
		in.Version = v
	}
	return in, nil
}

// versionSource is the body pg_lease gives lease.version() in every version.
var versionSource = regexp.MustCompile(`^\s*SELECT\s+'([0-9]+\.[0-9]+\.[0-9]+)'::text\s*;?\s*$`)

// schemaVersion reads the version a schema-only install records: the
// literal in the source of lease.version(), a LANGUAGE sql function without
// arguments. It returns "" when there is no such function or its body is not
// the one pg_lease writes. The function is never called.
func schemaVersion(ctx context.Context, q lease.Querier, nsp uint32) (string, error) {
	var src, lang string
	err := q.QueryRow(ctx, `
SELECT p.prosrc, l.lanname
  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
 WHERE p.pronamespace OPERATOR(pg_catalog.=) $1::pg_catalog.oid
   AND p.proname OPERATOR(pg_catalog.=) 'version'
   AND p.pronargs OPERATOR(pg_catalog.=) 0
   AND p.prokind OPERATOR(pg_catalog.=) 'f'`, nsp).Scan(&src, &lang)
	if isNoRows(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("lease: reading the installed version: %w", err)
	}
	m := versionSource.FindStringSubmatch(src)
	if lang != "sql" || m == nil {
		return "", nil
	}
	return m[1], nil
}

// TrustError returns nil when the current role can trust the install
// (Trusted), else an error matching ErrSquatted that names the owner and the
// object at fault.
func (in Installation) TrustError() error { return in.trust("") }

// trust returns nil when in is trusted, else an error matching ErrSquatted
// that says why, prefixed with op.
func (in Installation) trust(op string) error {
	if in.Trusted {
		return nil
	}
	mode := "a plain schema"
	if in.Extension {
		mode = "the extension"
	}
	err := fmt.Errorf("%w: pg_lease %s is installed as %s owned by role %s, but %s; nothing in it was run",
		ErrSquatted, in.Version, mode, quoteRole(in.Owner), in.reason)
	if op != "" {
		err = fmt.Errorf("%s: %w", op, err)
	}
	return err
}

// trusted reads the install through q and returns an error unless the
// current role can trust it: the check before any call of pg_lease's
// functions by an operator's call.
func trusted(ctx context.Context, q lease.Querier, op string) (Installation, error) {
	in, err := Describe(ctx, q)
	if err != nil {
		return Installation{}, fmt.Errorf("%s: %w", op, err)
	}
	return in, in.trust(op)
}

func quoteRole(r string) string {
	if r != "" && strings.Trim(r, "abcdefghijklmnopqrstuvwxyz0123456789_") == "" && (r[0] < '0' || r[0] > '9') {
		return r
	}
	return `"` + strings.ReplaceAll(r, `"`, `""`) + `"`
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

package fence

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/lease"
)

// PGGuardOptions lay out the table a PGGuard keeps epochs in.
//
// Table, ResourceColumn and EpochColumn are SQL identifiers written as in a
// SQL statement, and mean what they would mean there: an unquoted name is
// folded to lower case as PostgreSQL folds it (Jobs, JOBS and jobs all name
// the table created by CREATE TABLE Jobs), a double-quoted one is taken
// exactly ("Jobs" names only the table created as "Jobs"; "" inside stands
// for one "). An unquoted name is ASCII letters, digits, _ and $, not
// starting with a digit or $; a quoted one is any non-empty text without a
// NUL byte. Either is at most 63 bytes (PostgreSQL's NAMEDATALEN - 1: a
// longer one is refused rather than truncated). Table may be qualified by
// a schema, with a dot outside quotes (app.jobs, "My App"."Jobs").
type PGGuardOptions struct {
	// Table holding one row per guarded resource. Default fence_epochs
	// (created by EnsureTable).
	Table string
	// ResourceColumn is the table's unique (primary key) text column naming
	// the resource. Default "resource".
	ResourceColumn string
	// EpochColumn is the bigint column holding the highest accepted epoch.
	// Default "epoch".
	EpochColumn string
	// OwnRows: the table is the caller's own (rows of jobs, documents, ...)
	// with a fence epoch column; the row of a resource must exist (a
	// missing row gives ErrNoResource) and is never inserted. Otherwise
	// the row is inserted on the resource's first write.
	OwnRows bool
}

// PGGuard fences writes to a PostgreSQL database other than (or besides)
// the one holding the leases: it records, per resource, the highest epoch it
// has accepted and accepts a write only with an epoch at least as high, as
// one conditional statement whose row lock is held until the write
// commits:
//
//	INSERT INTO fence_epochs (resource, epoch) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET epoch = EXCLUDED.epoch
//	WHERE fence_epochs.epoch <= EXCLUDED.epoch
//
// (with OwnRows: UPDATE t SET epoch = $2 WHERE resource = $1 AND coalesce(epoch, 0) <= $2;
// a NULL epoch column counts as 0).
// Writers of one resource are thereby serialized, and once epoch E has
// committed, every write with a lower epoch fails with a *StaleError. A
// resource must be guarded by a single lease key: epochs of different keys
// are unrelated.
type PGGuard struct {
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
	table, resCol, epoCol string
	ownRows               bool
	claimSQL, readSQL     string
}

var unquotedRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)

// withDefaults returns o with every empty field set to its default, and
// validates the result: each name must parse as an SQL identifier (see
// PGGuardOptions). It returns the parsed names too. Each error names the
// field and matches lease.ErrInvalidInput.
func (o PGGuardOptions) withDefaults() (PGGuardOptions, [3]pgx.Identifier, error) {
	var ids [3]pgx.Identifier
	for i, f := range []struct {
		name  string
		value *string
		def   string
		parts int
	}{
		{"Table", &o.Table, "fence_epochs", 2},
		{"ResourceColumn", &o.ResourceColumn, "resource", 1},
		{"EpochColumn", &o.EpochColumn, "epoch", 1},
	} {
		if *f.value == "" {
			*f.value = f.def
		}
		id, err := parseIdentifier(*f.value, f.parts)
		if err != nil {
			return o, ids, fmt.Errorf("%w: PGGuardOptions.%s: %v", lease.ErrInvalidInput, f.name, err)
		}
		ids[i] = id
	}
	return o, ids, nil
}

// NewPGGuard returns a guard that runs its transactions on db. It fills the
// defaults of opts and validates them once; each error names the field and
// matches lease.ErrInvalidInput.
func NewPGGuard(
	db interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	},
	opts PGGuardOptions,
) (*PGGuard, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: NewPGGuard: db must not be nil", lease.ErrInvalidInput)
	}
	opts, ids, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	table, resCol, epoCol := ids[0], ids[1], ids[2]
	g := &PGGuard{db: db, table: table.Sanitize(), ownRows: opts.OwnRows,
		resCol: resCol.Sanitize(), epoCol: epoCol.Sanitize()}
	if g.ownRows {
		g.claimSQL = fmt.Sprintf(`UPDATE %[1]s SET %[3]s = $2 WHERE %[2]s = $1 AND coalesce(%[3]s, 0) <= $2 RETURNING %[3]s`,
			g.table, g.resCol, g.epoCol)
	} else {
		g.claimSQL = fmt.Sprintf(`INSERT INTO %[1]s AS f (%[2]s, %[3]s) VALUES ($1, $2)
ON CONFLICT (%[2]s) DO UPDATE SET %[3]s = EXCLUDED.%[3]s WHERE f.%[3]s <= EXCLUDED.%[3]s
RETURNING f.%[3]s`, g.table, g.resCol, g.epoCol)
	}
	g.readSQL = fmt.Sprintf(`SELECT %[3]s FROM %[1]s WHERE %[2]s = $1`, g.table, g.resCol, g.epoCol)
	return g, nil
}

// maxIdentifierBytes is PostgreSQL's NAMEDATALEN - 1.
const maxIdentifierBytes = 63

// parseIdentifier reads a possibly qualified SQL identifier (at most max
// dot-separated parts) as PostgreSQL reads one in a statement: unquoted
// parts folded to lower case, quoted parts exact (see PGGuardOptions). It
// returns the names the catalog holds, for pgx.Identifier to quote.
func parseIdentifier(s string, max int) (pgx.Identifier, error) {
	var parts pgx.Identifier
	for i := 0; ; {
		var part string
		if i < len(s) && s[i] == '"' {
			var b strings.Builder
			j := i + 1
			for {
				k := strings.IndexByte(s[j:], '"')
				if k < 0 {
					return nil, fmt.Errorf("%q: unterminated quoted identifier", s)
				}
				b.WriteString(s[j : j+k])
				j += k + 1
				if j < len(s) && s[j] == '"' { // "" inside: one quote
					b.WriteByte('"')
					j++
					continue
				}
				break
			}
			part, i = b.String(), j
			if part == "" {
				return nil, fmt.Errorf("%q: empty quoted identifier", s)
			}
			if strings.IndexByte(part, 0) >= 0 {
				return nil, fmt.Errorf("%q: NUL byte in an identifier", s)
			}
		} else {
			j := i
			for j < len(s) && s[j] != '.' && s[j] != '"' {
				j++
			}
			part, i = s[i:j], j
			if !unquotedRE.MatchString(part) {
				return nil, fmt.Errorf("%q is not an SQL identifier (unquoted: ASCII letters, digits, _ and $, not starting with a digit or $; or double-quoted)", s)
			}
			part = strings.ToLower(part) // ASCII only (unquotedRE), as PostgreSQL folds it
		}
		if len(part) > maxIdentifierBytes {
			return nil, fmt.Errorf("%q: identifier longer than %d bytes (PostgreSQL would truncate it)", s, maxIdentifierBytes)
		}
		parts = append(parts, part)
		if i == len(s) {
			break
		}
		if s[i] != '.' {
			return nil, fmt.Errorf("%q: unexpected %q after an identifier", s, s[i:])
		}
		i++
		if len(parts) == max {
			if max == 1 {
				return nil, fmt.Errorf("%q: a column name cannot be qualified", s)
			}
			return nil, fmt.Errorf("%q: at most schema.table", s)
		}
	}
	return parts, nil
}

// EnsureTable creates the epochs table if it does not exist (the default
// layout: resource text primary key, epoch bigint). It is not for OwnRows.
func (g *PGGuard) EnsureTable(ctx context.Context) error {
	if g.ownRows {
		return errors.New("fence: EnsureTable: the guard uses the caller's own rows (OwnRows)")
	}
	ddl := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  %s text PRIMARY KEY,
  %s bigint NOT NULL CHECK (%[3]s >= 1),
  updated_at timestamptz NOT NULL DEFAULT now())`, g.table, g.resCol, g.epoCol)
	for attempt := 0; ; attempt++ {
		err := g.exec(ctx, ddl)
		var pg *pgconn.PgError
		// Processes creating the table at once: IF NOT EXISTS does not
		// cover the race. A loser fails once the winner commits, on whichever
		// catalog entry it met first: a unique index (23505), the table
		// (42P07) or its row type (42710). The table exists then: once more
		// finds it.
		if attempt < 2 && errors.As(err, &pg) && (pg.Code == "23505" || pg.Code == "42P07" || pg.Code == "42710") {
			continue
		}
		if err != nil {
			return fmt.Errorf("fence: EnsureTable: %w", err)
		}
		return nil
	}
}

// exec runs one statement in a transaction of its own.
func (g *PGGuard) exec(ctx context.Context, sql string) error {
	return beginFunc(ctx, g.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql)
		return err
	})
}

// ErrNoResource: with OwnRows, the resource's row does not exist.
var ErrNoResource = errors.New("fence: no row for the resource")

// claim performs the conditional write for resource with token's epoch
// inside the caller's transaction tx, on the guarded database: it returns
// nil once the epoch is recorded (the row stays locked until tx ends), or a
// *StaleError when a higher epoch was accepted before (tx is then still
// usable). WriteResource is claim in a transaction of its own.
func (g *PGGuard) claim(ctx context.Context, tx pgx.Tx, resource string, token lease.Token) error {
	if token.Epoch < 1 {
		return fmt.Errorf("fence: token %s has no epoch", token)
	}
	var accepted int64
	err := tx.QueryRow(ctx, g.claimSQL, resource, token.Epoch).Scan(&accepted)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fence: claiming %q for epoch %d: %w", resource, token.Epoch, err)
	}
	// Rejected: read the epoch that won (the row is committed: the
	// conditional write waited for any concurrent writer).
	var highest *int64
	if err := tx.QueryRow(ctx, g.readSQL, resource).Scan(&highest); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w %q in %s", ErrNoResource, resource, g.table)
		}
		return fmt.Errorf("fence: reading epoch of %q: %w", resource, err)
	}
	h := int64(0)
	if highest != nil {
		h = *highest
	}
	return &StaleError{Resource: resource, Epoch: token.Epoch, Highest: h}
}

// Write fences the resource named by token.Key: see WriteResource.
func (g *PGGuard) Write(ctx context.Context, token lease.Token, fn func(tx pgx.Tx) error) error {
	return g.WriteResource(ctx, token.Key, token, fn)
}

// WriteResource begins a transaction on the guard's database, claims
// resource for token's epoch (rejecting a lower epoch than already accepted
// with a *StaleError, matching ErrStale, before fn runs), runs fn in the
// same transaction and commits: the epoch record and fn's writes commit
// together, and a writer with a higher epoch waits for them. As InTx, it
// returns lease.ErrCommitUnknown for a commit whose synchronous wait was
// cancelled on a connection opened with lease.ObserveCommits.
func (g *PGGuard) WriteResource(ctx context.Context, resource string, token lease.Token, fn func(tx pgx.Tx) error) error {
	return beginFunc(ctx, g.db, func(tx pgx.Tx) error {
		if err := g.claim(ctx, tx, resource, token); err != nil || fn == nil {
			return err
		}
		return fn(tx)
	})
}

// epoch returns the highest epoch accepted for resource (0 if none).
func (g *PGGuard) epoch(ctx context.Context, resource string) (int64, error) {
	var e *int64
	err := beginFunc(ctx, g.db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, g.readSQL, resource).Scan(&e)
	})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && e == nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return *e, nil
}

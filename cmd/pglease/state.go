package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Statuses of a key.
const (
	statusHeld     = "held"     // granted and not expired
	statusLapsed   = "lapsed"   // the grant expired without a release; the row still names its holder
	statusReleased = "released" // released by its holder or by release --force
	statusFree     = "free"     // not held; this role cannot see whether it lapsed or was released
)

// keyState is a key as pglease shows it: lease.State plus what the key's
// row says about a key that is not held.
//
// pg_lease 0.2.0's lease.inspect and lease.list return the owner only while
// the key is held, and nothing tells a lapsed grant from a release. The row
// does: a lapsed grant keeps its owner and expiry, a release clears the
// owner and sets the expiry to the release time. pglease reads the row
// (lease.leases) when the role may (the installing role, a superuser, or a
// role granted SELECT on it), with the same lazy-expiry rule as the
// functions; otherwise it shows a key that is not held as "free".
type keyState struct {
	lease.State
	Status string
	// Holder is the current holder (held) or the holder whose grant lapsed.
	Holder string
	// Since is when Status began on the server's clock: the grant (held),
	// the expiry (lapsed), the release (released); zero when unknown.
	Since time.Time
	// ReadAt is the local time of the read (for the expiry timer of watch).
	ReadAt time.Time
}

// reader reads key states on one connection, through the row when the
// role may read it.
type reader struct {
	a        *app
	rowsOK   *bool // nil: not probed yet on this connection
	loggedRO bool
}

// read returns the states of keys (every key when keys is nil), by key.
func (r *reader) read(ctx context.Context, conn *pgx.Conn, keys []string) ([]keyState, error) {
	if r.rowsOK == nil {
		ok, err := r.probe(ctx, conn)
		if err != nil {
			return nil, err
		}
		r.rowsOK = &ok
		if ok {
			r.a.logf("reading lease.leases directly: keys that are not held show lapsed or released, with the last holder of a lapsed grant")
		} else {
			r.a.logf("this role cannot read lease.leases: keys that are not held show as free (lease.inspect and lease.list do not say why)")
		}
	}
	if *r.rowsOK {
		return r.readRows(ctx, conn, keys)
	}
	return r.readPublic(ctx, conn, keys)
}

func (r *reader) probe(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.has_table_privilege(
		pg_catalog.to_regclass('lease.leases'), 'SELECT'), false)`).Scan(&ok)
	return ok, err
}

func (r *reader) readRows(ctx context.Context, conn *pgx.Conn, keys []string) ([]keyState, error) {
	var arg any
	if keys != nil {
		arg = keys
	}
	rows, err := conn.Query(ctx, `SELECT l.key, l.owner, l.epoch, l.acquired_at, l.expires_at,
		       l.owner IS NOT NULL AND l.expires_at > s.now, s.now
		  FROM lease.leases l, LATERAL (SELECT pg_catalog.clock_timestamp() AS now) s
		 WHERE $1::text[] IS NULL OR l.key = ANY ($1::text[])
		 ORDER BY l.key`, arg)
	if err != nil {
		return nil, r.fallback(ctx, conn, keys, err)
	}
	readAt := time.Now()
	var out []keyState
	for rows.Next() {
		var (
			s      keyState
			owner  *string
			acq    time.Time
			expiry time.Time
		)
		if err := rows.Scan(&s.Key, &owner, &s.Epoch, &acq, &expiry, &s.Held, &s.ServerNow); err != nil {
			rows.Close()
			return nil, err
		}
		s.Exists, s.ReadAt = true, readAt
		switch {
		case s.Held:
			s.Status, s.Owner, s.Holder = statusHeld, *owner, *owner
			s.AcquiredAt, s.ExpiresAt, s.Since = acq, expiry, acq
		case owner != nil:
			s.Status, s.Holder, s.AcquiredAt, s.ExpiresAt, s.Since = statusLapsed, *owner, acq, expiry, expiry
		default:
			s.Status, s.Since = statusReleased, expiry
		}
		out = append(out, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, r.fallback(ctx, conn, keys, err)
	}
	return out, nil
}

// fallback: the row could not be read (a later pg_lease changed the table,
// or the privilege went away): use the functions from now on.
func (r *reader) fallback(ctx context.Context, conn *pgx.Conn, keys []string, err error) error {
	if conn.IsClosed() || !isServerError(err) {
		return err
	}
	r.a.logf("reading lease.leases failed (%s): using lease.list", oneLine(err.Error()))
	no := false
	r.rowsOK = &no
	return errRetry
}

var errRetry = errors.New("retry")

func isServerError(err error) bool { return sqlState(err) != "" }

func (r *reader) readPublic(ctx context.Context, conn *pgx.Conn, keys []string) ([]keyState, error) {
	states, err := lease.New(conn).List(ctx)
	if err != nil {
		return nil, err
	}
	readAt := time.Now()
	var out []keyState
	for _, st := range states {
		if keys != nil && !slices.Contains(keys, st.Key) {
			continue
		}
		s := keyState{State: st, ReadAt: readAt, Status: statusFree}
		if st.Held {
			s.Status, s.Holder, s.Since = statusHeld, st.Owner, st.AcquiredAt
		}
		out = append(out, s)
	}
	return out, nil
}

// readKeys is read, retried once through the functions when the row read
// fell back.
func (r *reader) readKeys(ctx context.Context, conn *pgx.Conn, keys []string) ([]keyState, error) {
	out, err := r.read(ctx, conn, keys)
	if errors.Is(err, errRetry) {
		out, err = r.read(ctx, conn, keys)
	}
	return out, err
}

// checkKey applies the server's key rule (lease.CheckKey) before anything
// is sent, naming the key.
func checkKey(k string) error {
	if err := lease.CheckKey(k); err != nil {
		return fmt.Errorf("invalid key %s: %w", quoteField(truncate(k, 64)), err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

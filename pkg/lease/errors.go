package lease

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Match them with errors.Is; errors.As reaches the
// *pgconn.PgError (with its DETAIL) where the server raised one.
var (
	// ErrLost matches every error that says the caller no longer holds the
	// grant it presented: ErrNotOwner, ErrLapsed and ErrEpochMismatch.
	ErrLost = errors.New("lease: grant lost")
	// ErrNotOwner: the key is unknown, free, or held by another owner.
	ErrNotOwner = errors.New("lease: not_owner")
	// ErrLapsed: the caller held the key and that grant expired.
	ErrLapsed = errors.New("lease: lapsed")
	// ErrEpochMismatch: the caller holds the key under another epoch.
	ErrEpochMismatch = errors.New("lease: epoch_mismatch")

	// ErrInvalidInput: the server rejected an argument (SQLSTATE 22023,
	// invalid_input); the PgError's Detail names every violated constraint.
	// Also returned, without a round trip, for arguments that cannot be sent
	// faithfully (a TTL below one microsecond).
	ErrInvalidInput = errors.New("lease: invalid input")
	// ErrWaitTimeout: a server-side blocking acquire saw the key held for its
	// whole wait (SQLSTATE 57014, message "timeout").
	ErrWaitTimeout = errors.New("lease: wait timed out")
	// ErrInvalidIsolation: a server-side blocking acquire was called in a
	// REPEATABLE READ or SERIALIZABLE transaction (SQLSTATE 25000).
	ErrInvalidIsolation = errors.New("lease: blocking acquire needs READ COMMITTED")
	// ErrNotInstalled: neither the pg_lease extension nor the schema-only
	// install is present in the database.
	ErrNotInstalled = errors.New("lease: pg_lease is not installed in this database")
	// ErrVersionMismatch: the installed pg_lease has another version than
	// this module ships.
	ErrVersionMismatch = errors.New("lease: installed pg_lease version differs")
	// ErrModeMismatch: pg_lease is installed, but in the other Mode than the
	// one asked for (InstallExtension over a schema-only install).
	ErrModeMismatch = errors.New("lease: pg_lease is installed in the other mode")
	// ErrWaiterClosed: the Waiter was closed while or before the call waited.
	ErrWaiterClosed = errors.New("lease: waiter closed")
	// ErrReadOnly: the server cannot write (a standby, or a read-only
	// session): SQLSTATE 25006, or 55000 "recovery is in progress".
	ErrReadOnly = errors.New("lease: server is read-only or a standby")
)

// statusError is the error for a renew, release or fence whose status was
// not ok. It matches its status sentinel and ErrLost.
type statusError struct {
	op, key, owner string
	epoch          int64
	status         error
	pg             *pgconn.PgError // set when the server raised it (fence)
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %q (owner %q, epoch %d): %v", e.op, e.key, e.owner, e.epoch, e.status)
}

func (e *statusError) Unwrap() []error {
	errs := []error{e.status, ErrLost}
	if e.pg != nil {
		errs = append(errs, e.pg)
	}
	return errs
}

func statusErr(op string, t Token, status string) error {
	var s error
	switch status {
	case "ok":
		return nil
	case "not_owner":
		s = ErrNotOwner
	case "lapsed":
		s = ErrLapsed
	case "epoch_mismatch":
		s = ErrEpochMismatch
	default:
		return fmt.Errorf("lease: %s %q: unknown status %q from server", op, t.Key, status)
	}
	return &statusError{op: op, key: t.Key, owner: t.Owner, epoch: t.Epoch, status: s}
}

// serverError wraps a server error with the sentinel it corresponds to.
type serverError struct {
	op   string
	kind error
	pg   *pgconn.PgError
}

func (e *serverError) Error() string {
	if e.pg.Detail != "" {
		return fmt.Sprintf("%s: %v: %s", e.op, e.kind, e.pg.Detail)
	}
	return fmt.Sprintf("%s: %v (%s)", e.op, e.kind, e.pg.Message)
}

func (e *serverError) Unwrap() []error { return []error{e.kind, e.pg} }

// mapError turns a server error into the package's typed errors; other
// errors (connection, context) are wrapped with the operation's name.
func mapError(op string, t Token, err error) error {
	if err == nil {
		return nil
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return fmt.Errorf("%s %q: %w", op, t.Key, err)
	}
	switch {
	case pg.Code == "22023" && pg.Message == "invalid_input":
		return &serverError{op: op, kind: ErrInvalidInput, pg: pg}
	case pg.Code == "57014" && pg.Message == "timeout":
		return &serverError{op: op, kind: ErrWaitTimeout, pg: pg}
	case pg.Code == "25000" && pg.Message == "invalid_isolation":
		return &serverError{op: op, kind: ErrInvalidIsolation, pg: pg}
	case pg.Code == "55000" && (pg.Message == "not_owner" || pg.Message == "lapsed" || pg.Message == "epoch_mismatch"):
		se := statusErr(op, t, pg.Message).(*statusError)
		se.pg = pg
		return se
	case pg.Code == "25006" || (pg.Code == "55000" && strings.Contains(pg.Message, "recovery is in progress")):
		return &serverError{op: op, kind: ErrReadOnly, pg: pg}
	case pg.Code == "3F000" || (pg.Code == "42883" && isLeaseFunction(pg.Message)):
		// invalid_schema_name / undefined_function lease.*
		return &serverError{op: op, kind: ErrNotInstalled, pg: pg}
	}
	return fmt.Errorf("%s %q: %w", op, t.Key, err)
}

func isLeaseFunction(msg string) bool {
	return strings.Contains(msg, "lease.")
}

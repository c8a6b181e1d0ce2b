package lease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

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
	// faithfully (a TTL below one microsecond), and for a key or owner that
	// the server cannot receive as text (a NUL byte or invalid UTF-8:
	// SQLSTATE 22021). Constructors of pkg/ without a sentinel of their own
	// wrap it too, for an option they refuse (the error names the field).
	ErrInvalidInput = errors.New("lease: invalid input")

	// ErrInstallNotChecked: ForceRelease or Cleanup on a client that was
	// not told the install is trusted (Client.TrustInstall). Nothing was
	// sent. Operators call leaseadmin.ForceRelease and leaseadmin.Cleanup,
	// which check the install first.
	ErrInstallNotChecked = errors.New("lease: operator call on an install nobody checked (use leaseadmin.ForceRelease or leaseadmin.Cleanup)")
	// ErrWaitTimeout: a server-side blocking acquire saw the key held for its
	// whole wait (SQLSTATE 57014, message "timeout").
	ErrWaitTimeout = errors.New("lease: wait timed out")
	// ErrGrace: the server makes no new grant before the grace after a
	// promotion ends (pg_lease 0.4.0 answers such an acquire with the end).
	// errors.As reaches a *GraceError with the instant.
	ErrGrace = errors.New("lease: no new grant during the promotion grace")
	// ErrInvalidIsolation: a server-side blocking acquire was called in a
	// REPEATABLE READ or SERIALIZABLE transaction (SQLSTATE 25000).
	ErrInvalidIsolation = errors.New("lease: blocking acquire needs READ COMMITTED")
	// ErrNotInstalled: neither the pg_lease extension nor the schema-only
	// install is present in the database.
	ErrNotInstalled = errors.New("lease: pg_lease is not installed in this database")
	// ErrReadOnly: the server cannot write (a standby, or a read-only
	// session): SQLSTATE 25006, or 55000 "recovery is in progress".
	ErrReadOnly = errors.New("lease: server is read-only or a standby")
	// ErrPermission: the role may not call the function (SQLSTATE 42501),
	// for example lease.force_release or lease.cleanup without EXECUTE.
	ErrPermission = errors.New("lease: permission denied")

	// Causes with which a Term ends (context.Cause of its contexts, and
	// Term.Err); a term the server ended carries the error matching ErrLost
	// instead.

	// ErrLocalDeadline: no renewal arrived before the term's local deadline
	// (Grant.ValidUntil minus the margin). The server may still hold the
	// grant for up to the margin; nobody else can have it yet.
	ErrLocalDeadline = errors.New("lease: local deadline of the grant passed without renewal")
	// ErrReleased: the holder gave the term up before its local deadline
	// (Term.Release, an elector resigning, client-go's ReleaseOnCancel); a
	// release at or after the deadline ends it with ErrLocalDeadline.
	ErrReleased = errors.New("lease: released by the holder")
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
	if isCommitUnknown(err) {
		return err
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return fmt.Errorf("%s %q: %w", op, t.Key, err)
	}
	switch {
	case pg.Code == "22023" && pg.Message == "invalid_input":
		return &serverError{op: op, kind: ErrInvalidInput, pg: pg}
	case pg.Code == "22021":
		// character_not_in_repertoire: a key or owner with a NUL byte or
		// invalid UTF-8 cannot even be received as text (the server refuses
		// the parameter before pg_lease runs; nothing changed). Reported as
		// the client's own refusal: no pg_lease constraint was checked.
		return fmt.Errorf("%s %q: %w: key and owner must be valid UTF-8 without NUL bytes (the server refused the text: %s)",
			op, t.Key, ErrInvalidInput, pg.Message)
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
	case pg.Code == "42501":
		return &serverError{op: op, kind: ErrPermission, pg: pg}
	case pg.Code == "3F000" || (pg.Code == "42883" && isLeaseFunction(pg.Message)):
		// invalid_schema_name / undefined_function lease.*
		return &serverError{op: op, kind: ErrNotInstalled, pg: pg}
	}
	return fmt.Errorf("%s %q: %w", op, t.Key, err)
}

// WrapError returns err, from a statement of op that called pg_lease's SQL
// functions, as this package's calls return their errors: a server error
// matches its kind (ErrInvalidInput, ErrPermission, ErrNotInstalled,
// ErrReadOnly, ...) and still reaches the *pgconn.PgError through
// errors.As; any other error is wrapped with op and key. For code that
// runs pg_lease's read functions on a Querier of its own (pkg/leaseadmin,
// pkg/leasemetrics). nil stays nil.
func WrapError(op, key string, err error) error { return mapError(op, Token{Key: key}, err) }

func isLeaseFunction(msg string) bool {
	return strings.Contains(msg, "lease.")
}

// retryOnce runs call, and once more when it failed on a connection-level
// error (connectionError) while ctx is still alive: a pooled connection that
// died while idle (a terminated backend, a restarted proxy) fails the first
// query sent on it, and the pool hands the retry a new one. One retry is safe
// because every call it wraps is idempotent or conditional: acquire with
// wait 0 by the same owner returns the same grant (same epoch) if the first
// attempt committed; renew and release are conditional on owner and epoch
// (a release that committed before its reply was lost makes the retry answer
// not_owner, which is also what a lost grant answers); inspect and list
// only read. A call that reported ErrCommitUnknown is never retried: its
// change is committed on the primary, so the retry would confirm it
// without the synchronous standbys.
func retryOnce(ctx context.Context, call func() error) error {
	err := call()
	if err != nil && ctx.Err() == nil && !isCommitUnknown(err) && connectionError(err) {
		err = call()
	}
	return err
}

// connectionError reports whether err says the connection failed rather
// than the server answering: SQLSTATE class 08 (connection exception),
// 57P01-57P03 (the backend was terminated, the server is shutting down or
// starting), an EOF or a network error, or an error pgconn itself calls
// safe to retry. Context errors and timeouts are not.
func connectionError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "08") || pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03"
	}
	var ne net.Error
	return pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.As(err, &ne)
}

// GraceError is Acquire's answer during the grace after a promotion or a
// restart of the server: no new grant of Key before Until (server clock). It
// matches ErrGrace.
type GraceError struct {
	Key string
	// Until is when the grace ends, on the server's clock.
	Until time.Time
	// UntilLocal is the local instant (on the Client's clock) by which the
	// grace has certainly ended on the server: the reply's receipt plus the
	// time the server said was left. Waking at it is never early.
	UntilLocal time.Time
}

func (e *GraceError) Error() string {
	return fmt.Sprintf("acquire %q: %v (until %s)", e.Key, ErrGrace, e.Until.UTC().Format(time.RFC3339Nano))
}

func (e *GraceError) Unwrap() error { return ErrGrace }

package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Acknowledged means replicated.
//
// With synchronous replication (synchronous_standby_names), PostgreSQL
// commits a transaction locally, then waits for the synchronous standbys.
// When that wait is cancelled (pg_cancel_backend, a statement_timeout, a
// pooler's query timeout, a client's cancel request), COMMIT still returns
// success, with a WARNING (SQLSTATE 01000) "canceling wait for synchronous
// replication due to user request": the change is committed on this server
// and may be missing on every standby. When the backend is terminated during
// the wait (pg_terminate_backend, a fast shutdown), it sends a WARNING
// (SQLSTATE 57P01) "canceling the wait for synchronous replication and
// terminating connection due to administrator command" and closes the
// connection. A failover to a standby then loses the change.
//
// pgx delivers those warnings only to the connection's notice handler
// (pgconn.Config.OnNotice). ObserveCommits installs one that counts them
// per connection; the Client compares the count before and after each
// acquire, renew, release and forced release it runs on a connection it can
// see (a *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn or a ConnLender), and
// reports such a call as ErrCommitUnknown instead of its result.

// ObserveCommits makes every connection opened with cfg record the server's
// warnings that a commit's wait for synchronous replication was cancelled,
// so that a Client on those connections never reports such a commit as done
// (ErrCommitUnknown). It keeps cfg's own OnNotice, which is still called for
// every notice. Use it on every configuration whose connections a Client
// changes leases through:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	lease.ObserveCommits(&cfg.ConnConfig.Config)
//	cfg.AfterConnect = lease.WarmConn
//
// Without it, a Client cannot see the warning (pgx gives it to nobody else)
// and reports such a commit as success, as PostgreSQL does. Warnings are
// matched by SQLSTATE (01000 and 57P01 at severity WARNING), not by text,
// so a server that translates its messages (lc_messages) is covered; a call
// of pg_lease raises no warning of its own.
func ObserveCommits(cfg *pgconn.Config) {
	next := cfg.OnNotice
	cfg.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if n.SeverityUnlocalized == "WARNING" && (n.Code == "01000" || n.Code == "57P01") {
			w, _ := c.CustomData()[commitWarningsKey].(*commitWarnings)
			if w == nil {
				w = &commitWarnings{}
				c.CustomData()[commitWarningsKey] = w
			}
			w.n++
			w.last = n
		}
		if next != nil {
			next(c, n)
		}
	}
}

const commitWarningsKey = "pg_lease.commit_warnings"

// commitWarnings counts the warnings of one connection. The notice handler
// runs on the goroutine that reads the connection, which is the one running
// the call while the Client holds the connection: no lock is needed.
type commitWarnings struct {
	n    uint64
	last *pgconn.Notice
}

func warningsOf(c *pgconn.PgConn) (uint64, *pgconn.Notice) {
	if c == nil {
		return 0, nil
	}
	if w, ok := c.CustomData()[commitWarningsKey].(*commitWarnings); ok {
		return w.n, w.last
	}
	return 0, nil
}

// ErrCommitUnknown: the call changed the lease on this server, but its
// commit's wait for the synchronous standbys was cancelled (or the backend
// was terminated during it): the change may be lost by a failover. Do not
// act on it. A grant in that state was not handed to the caller: it lapses
// at its expiry, or the owner's next Acquire of the key confirms it once
// the standbys have it (the idempotent re-acquire waits for them, since
// pg_lease 0.4.0). A renewal in that state leaves the term at its previous
// deadline; a release in that state may be retried. The error's text
// names the call, the token and the server's warning.
var ErrCommitUnknown = errors.New("lease: commit not confirmed by the synchronous standbys")

// commitUnknownError is the error of a call whose commit matched
// ErrCommitUnknown.
type commitUnknownError struct {
	Op    string // "acquire", "renew", "release", "renew_many", "force_release" or "commit"
	Token Token  // the grant the call made or changed (Epoch 0 when unknown)
	// Notice is the server's warning.
	Notice *pgconn.Notice
}

func (e *commitUnknownError) Error() string {
	msg := ""
	if e.Notice != nil {
		msg = ": server said: " + e.Notice.Message
	}
	return fmt.Sprintf("%s %s: %v%s", e.Op, e.Token, ErrCommitUnknown, msg)
}

func (e *commitUnknownError) Unwrap() error { return ErrCommitUnknown }

// onConn runs call on one connection of c.db that the client can watch for
// commit warnings, and returns a *commitUnknownError when one arrived during
// the call (whatever the call returned: the terminated variant also closes
// the connection). A pgx.Tx is not watched: its commit is the caller's
// (see Commit). token fills the error; it is called after call.
func (c *Client) onConn(ctx context.Context, op string, token func() Token, call func(Querier) error) error {
	q, pg, release, err := connOf(ctx, c.db)
	if err != nil {
		return err
	}
	defer release()
	before, _ := warningsOf(pg)
	err = call(q)
	if after, n := warningsOf(pg); after != before {
		return &commitUnknownError{Op: op, Token: token(), Notice: n}
	}
	return err
}

// ConnLender is a Querier of its own making (one connection reopened when
// lost, a wrapper of a pool) that lends a Client the connection each call
// runs on, so that the Client sees that call's commit warnings as it does
// on a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn. LendConn returns the
// Querier to run the call on, the connection under it (opened with
// ObserveCommits) and a function that ends the loan.
type ConnLender interface {
	Querier
	LendConn(ctx context.Context) (q Querier, conn *pgconn.PgConn, give func(), err error)
}

// connOf returns the Querier to run one call on and the connection under
// it, when the client can see it.
func connOf(ctx context.Context, db Querier) (Querier, *pgconn.PgConn, func(), error) {
	switch d := db.(type) {
	case ConnLender:
		return d.LendConn(ctx)
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		return pc, pc.Conn().PgConn(), pc.Release, nil
	case *pgxpool.Conn:
		return d, d.Conn().PgConn(), func() {}, nil
	case *pgx.Conn:
		return d, d.PgConn(), func() {}, nil
	}
	return db, nil, func() {}, nil
}

// Commit commits tx, the caller's own transaction on a connection
// configured with ObserveCommits, and returns an error matching
// ErrCommitUnknown when the commit's wait for the synchronous standbys was
// cancelled: for a transaction in which the caller acquired, renewed or
// released a lease, that outcome is not known to survive a failover.
func Commit(ctx context.Context, tx pgx.Tx) error {
	pg := tx.Conn().PgConn()
	before, _ := warningsOf(pg)
	err := tx.Commit(ctx)
	if after, n := warningsOf(pg); after != before {
		return &commitUnknownError{Op: "commit", Notice: n}
	}
	return err
}

// isCommitUnknown reports whether err is a commit the client must not
// retry: a second attempt would confirm what the first left unknown.
func isCommitUnknown(err error) bool { return errors.Is(err, ErrCommitUnknown) }

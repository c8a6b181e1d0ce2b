package lease

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
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
// (pgconn.Config.OnNotice), which cannot be added to a connection or a pool
// once it is open. So the Client watches a call's commit in one of two ways,
// on every connection it can see (a *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn or a ConnLender), whatever the pool's configuration:
//
//   - On a connection opened with ObserveCommits, a handler counts the
//     warnings; the Client compares the count before and after the call,
//     which commits on its own (one round trip).
//   - On any other connection, the Client runs the call in a transaction of
//     its own and sends the COMMIT itself, reading the server's reply
//     message by message, warnings included (three round trips).
//
// Either way an acquire, renew, release, batch or forced release whose
// commit's wait was cancelled is ErrCommitUnknown, never its result. A call
// inside the caller's transaction (a pgx.Tx, or a connection in a
// transaction) commits with that transaction: see Commit.

// ObserveCommits makes every connection opened with cfg record the server's
// warnings that a commit's wait for synchronous replication was cancelled,
// so that a Client's calls on those connections see them in one round trip
// (without it the Client sees them too, with a transaction of its own per
// change: see above). It keeps cfg's own OnNotice and AfterConnect, which
// still run. Use it on every configuration whose connections a Client
// changes leases through:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	lease.ObserveCommits(&cfg.ConnConfig.Config)
//	cfg.AfterConnect = lease.WarmConn
//
// Warnings are matched by SQLSTATE (01000 and 57P01 at severity WARNING),
// not by text, so a server that translates its messages (lc_messages) is
// covered; a call of pg_lease raises no warning of its own.
func ObserveCommits(cfg *pgconn.Config) {
	next := cfg.OnNotice
	cfg.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if isCommitWarning(n) {
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
	// The mark that tells the Client that this connection counts warnings.
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if _, ok := c.CustomData()[commitWarningsKey].(*commitWarnings); !ok {
			c.CustomData()[commitWarningsKey] = &commitWarnings{}
		}
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
}

// isCommitWarning reports whether n says that a commit's wait for the
// synchronous standbys was cancelled (or the backend terminated during it).
func isCommitWarning(n *pgconn.Notice) bool {
	return n.SeverityUnlocalized == "WARNING" && (n.Code == "01000" || n.Code == "57P01")
}

const commitWarningsKey = "pg_lease.commit_warnings"

// commitWarnings counts the warnings of one connection. The notice handler
// runs on the goroutine that reads the connection, which is the one running
// the call while the Client holds the connection: no lock is needed.
type commitWarnings struct {
	n    uint64
	last *pgconn.Notice
}

// observed reports whether c was opened with ObserveCommits.
func observed(c *pgconn.PgConn) bool {
	_, ok := c.CustomData()[commitWarningsKey].(*commitWarnings)
	return ok
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
// the connection). On a connection without ObserveCommits, and not in a
// transaction, it runs call in a transaction of its own (ownCommit). A
// pgx.Tx is not watched: its commit is the caller's (see Commit). token
// fills the error; it is called after call.
func (c *Client) onConn(ctx context.Context, op string, token func() Token, call func(Querier) error) error {
	q, pg, release, err := connOf(ctx, c.db)
	if err != nil {
		return err
	}
	defer release()
	if pg != nil && !observed(pg) && pg.TxStatus() == 'I' {
		n, err := ownCommit(ctx, q, pg, call)
		if n != nil {
			return &commitUnknownError{Op: op, Token: token(), Notice: n}
		}
		return err
	}
	before, _ := warningsOf(pg)
	err = call(q)
	if after, n := warningsOf(pg); after != before {
		return &commitUnknownError{Op: op, Token: token(), Notice: n}
	}
	return err
}

// ownCommit runs call on q (whose connection is pg) between a BEGIN and a
// COMMIT of its own, and returns the server's warning that the commit's
// wait for the synchronous standbys was cancelled, if one came. It sends
// the COMMIT itself and reads every message of the reply: on a connection
// opened without ObserveCommits, pgx hands warnings to nobody else. When
// call fails, the transaction is rolled back (or the connection closed when
// that fails: it must not go back to a pool inside a transaction).
func ownCommit(ctx context.Context, q Querier, pg *pgconn.PgConn, call func(Querier) error) (*pgconn.Notice, error) {
	if _, err := q.Exec(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	if err := call(q); err != nil {
		abort(ctx, pg)
		return nil, err
	}
	return commitSeeing(ctx, pg)
}

// abort rolls back pg's transaction, or closes pg when that cannot be done.
func abort(ctx context.Context, pg *pgconn.PgConn) {
	if pg.IsClosed() {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := pg.Exec(rctx, "ROLLBACK").ReadAll(); err != nil || pg.TxStatus() != 'I' {
		_ = pg.Close(rctx)
	}
}

// commitSeeing sends COMMIT on pg, which must be idle in a transaction, and
// reads the reply to its end (ReadyForQuery). It returns the warning that
// the commit's wait for the synchronous standbys was cancelled, if one came,
// and the server's error, if the COMMIT failed. A connection whose reply
// could not be read to its end is closed.
func commitSeeing(ctx context.Context, pg *pgconn.PgConn) (warning *pgconn.Notice, err error) {
	fe := pg.Frontend()
	fe.Send(&pgproto3.Query{String: "COMMIT"})
	if err := fe.Flush(); err != nil {
		_ = pg.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	var serverErr error
	for {
		msg, err := pg.ReceiveMessage(ctx)
		if err != nil {
			_ = pg.Close(context.WithoutCancel(ctx))
			return warning, err
		}
		switch m := msg.(type) {
		case *pgproto3.NoticeResponse:
			if n := (*pgconn.Notice)(pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(m))); isCommitWarning(n) {
				warning = n
			}
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			return warning, serverErr
		}
	}
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

// Commit commits tx, the caller's own transaction, and returns an error
// matching ErrCommitUnknown when the commit's wait for the synchronous
// standbys was cancelled: for a transaction in which the caller acquired,
// renewed or released a lease, that outcome is not known to survive a
// failover. On a connection opened with ObserveCommits it is tx.Commit. On
// any other it sends the COMMIT itself and reads the reply (then ends tx,
// which sends a ROLLBACK the server answers with a warning that no
// transaction is in progress); tx must then be a transaction of pgx or
// pgxpool (a nested one commits only its savepoint, as tx.Commit does), or
// Commit returns an error matching ErrInvalidInput and commits nothing.
func Commit(ctx context.Context, tx pgx.Tx) error {
	pg := tx.Conn().PgConn()
	if !observed(pg) && pg.TxStatus() == 'T' {
		switch kind := txKind(tx); kind {
		case txNested:
			return tx.Commit(ctx)
		case txUnknown:
			return fmt.Errorf("lease: Commit: %w: a %T on a connection opened without ObserveCommits: the commit's wait for the synchronous standbys could not be seen; nothing was committed",
				ErrInvalidInput, tx)
		}
		n, err := commitSeeing(ctx, pg)
		_ = tx.Rollback(context.WithoutCancel(ctx)) // ends tx; the transaction already ended
		if n != nil {
			return &commitUnknownError{Op: "commit", Notice: n}
		}
		return err
	}
	before, _ := warningsOf(pg)
	err := tx.Commit(ctx)
	if after, n := warningsOf(pg); after != before {
		return &commitUnknownError{Op: "commit", Notice: n}
	}
	return err
}

type txKinds int

const (
	txTop     txKinds = iota // commits the server's transaction
	txNested                 // releases a savepoint
	txUnknown                // another implementation of pgx.Tx
)

// txKind tells pgx's and pgxpool's transactions apart by their types (pgx's
// are unexported; a pgxpool.Tx is always a pool connection's top-level one).
func txKind(tx pgx.Tx) txKinds {
	if _, ok := tx.(*pgxpool.Tx); ok {
		return txTop
	}
	switch fmt.Sprintf("%T", tx) {
	case "*pgx.dbTx":
		return txTop
	case "*pgx.dbSimulatedNestedTx":
		return txNested
	}
	return txUnknown
}

// isCommitUnknown reports whether err is a commit the client must not
// retry: a second attempt would confirm what the first left unknown.
func isCommitUnknown(err error) bool { return errors.Is(err, ErrCommitUnknown) }

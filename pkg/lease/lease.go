package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/utils/clock"
)

// Querier is what the client needs from a connection: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Token is a fencing token: the key, the owner and the epoch of one grant.
// Guards of external systems compare epochs: a write carrying an epoch lower
// than one already accepted is stale.
type Token struct {
	Key   string
	Owner string
	Epoch int64
}

func (t Token) String() string { return fmt.Sprintf("%s/%s@%d", t.Key, t.Owner, t.Epoch) }

// Grant is a lease held by Owner on Key under Epoch, as the server reported it.
type Grant struct {
	Token
	// ExpiresAt is the server-clock instant at which the grant lapses.
	ExpiresAt time.Time
	// TTL is the duration requested by the call that granted or renewed it.
	TTL time.Duration

	// validUntil is the local monotonic instant up to which the grant is
	// certainly held: the send time of the request that returned it plus
	// the time the server said was left (ExpiresAt minus the server's clock
	// read after the decision), roundTrip.earliest. The server cannot have
	// decided before the request was sent, so, with the two clocks running
	// at the same rate, the server's expiry comes later than validUntil.
	validUntil time.Time
}

// ValidUntil is the local instant (carrying a monotonic reading) before which
// the grant is certainly still held on the server, clock rates being equal.
// Stop acting under the grant a margin before it, to cover clock-rate drift
// and scheduling delay.
func (g Grant) ValidUntil() time.Time { return g.validUntil }

// State is a key's observable state (lease.inspect and lease.list).
type State struct {
	Key string
	// Exists is false for a key that was never leased (inspect returns no row).
	Exists bool
	Held   bool
	// Owner and ExpiresAt are set only while Held.
	Owner     string
	ExpiresAt time.Time
	// AcquiredAt is when the current grant began (when Held; Inspect fills
	// it from pg_lease 0.4.0 on).
	AcquiredAt time.Time
	// Epoch is the key's fencing counter: the current grant's epoch while
	// held; otherwise every epoch <= Epoch is stale and the next grant
	// carries a greater one.
	Epoch int64
	// Lapsed and Released say why a key that exists is not held: its last
	// grant expired without a release, or it was released (by its holder
	// or leaseadmin.ForceRelease). Both stay false on a server before 0.4.0,
	// which does not say.
	Lapsed, Released bool
	// LastOwner is the owner of the current or lapsed grant; empty once
	// released, or before 0.4.0. Every role saw it in Owner while held.
	LastOwner string
	// Since is when the key entered its state, on the server's clock: the
	// grant, the expiry or the release. Zero before 0.4.0.
	Since time.Time
	// ServerNow is the server's clock when the state was read.
	ServerNow time.Time

	rt roundTrip // the read's round trip (ExpiresLocal)
}

// ExpiresLocal is the local instant (monotonic, on the Client's clock) by
// which the grant seen held in s has certainly expired on the server unless
// it was renewed: the receipt of the reply that read it plus the time the
// server said was left. Zero when s is not held or was not read by
// Inspect or List. Waking at it is never early, and late by at most the
// read's round trip.
func (s State) ExpiresLocal() time.Time {
	if !s.Held || s.rt.received.IsZero() {
		return time.Time{}
	}
	return s.rt.latest(s.ExpiresAt)
}

// ExpiresEarliest is the first local instant at which the server's clock
// can show ExpiresAt: the send of the read that saw s plus the time the
// server said was left. Zero when s is not held or was not read by Inspect
// or List. The server's expiry falls between it and ExpiresLocal.
func (s State) ExpiresEarliest() time.Time {
	if !s.Held || s.rt.received.IsZero() {
		return time.Time{}
	}
	return s.rt.earliest(s.ExpiresAt)
}

// Client calls the pg_lease SQL functions through a Querier.
type Client struct {
	db      Querier
	clock   clock.WithDelayedExecution
	checked bool // TrustInstall: the operator calls may run
}

// New returns a client that runs every call on db, on the real clock.
func New(db Querier) *Client { return &Client{db: db, clock: realClock} }

// WithClock returns a client on the same Querier that reads clk for every
// local instant (Grant.ValidUntil, State.ExpiresLocal) and arms every timer
// of its terms and waits on it. pkg/elector and pkg/resourcelock take their
// clock from their client, so a fake clock (k8s.io/utils/clock/testing)
// drives deadlines and margins in tests without a server's help.
func (c *Client) WithClock(clk clock.WithDelayedExecution) *Client {
	return &Client{db: c.db, clock: clk, checked: c.checked}
}

// TrustInstall returns a client on the same Querier and clock whose
// operator calls (ForceRelease, Cleanup) run. Without it they return
// ErrInstallNotChecked and send nothing: run by a superuser in a database
// where another role prepared schema lease, they would run that role's
// functions as superuser. Call it only after checking the install, as
// leaseadmin.ForceRelease and leaseadmin.Cleanup do (leaseadmin.Describe).
func (c *Client) TrustInstall() *Client {
	return &Client{db: c.db, clock: c.clock, checked: true}
}

// Clock is the clock the client reads (the real clock unless WithClock).
func (c *Client) Clock() clock.WithDelayedExecution { return c.clock }

// Querier is the Querier the client runs its calls on (New's db).
func (c *Client) Querier() Querier { return c.db }

func checkTTL(op string, t Token, name string, d time.Duration, allowZero bool) error {
	if d < time.Microsecond && !(allowZero && d == 0) {
		return fmt.Errorf("%s %q: %w: %s %v is below PostgreSQL's interval resolution of 1µs or not positive",
			op, t.Key, ErrInvalidInput, name, d)
	}
	return nil
}

// Acquire tries once to take key for owner for ttl (lease.acquire with
// wait 0). ok is false when another owner holds the key. Acquiring a key the
// owner already holds returns the same grant (same epoch and expiry).
// During the grace after a promotion or a restart of the server, when the
// server makes no new grant, it
// returns a *GraceError (matching ErrGrace) that says when the grace ends:
// wait until its UntilLocal, not in a loop.
func (c *Client) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (g Grant, ok bool, err error) {
	return c.acquire(ctx, "acquire", key, owner, ttl, 0)
}

// AcquireWait is lease.acquire with a server-side wait: the server polls until
// the key can be taken or wait passes (ErrWaitTimeout, also for wait 0 on a
// held key). It occupies a
// connection and keeps a transaction open for the whole wait; listen.Waiter waits
// without either.
func (c *Client) AcquireWait(ctx context.Context, key, owner string, ttl, wait time.Duration) (Grant, error) {
	g, ok, err := c.acquire(ctx, "acquire", key, owner, ttl, wait)
	if err == nil && !ok {
		// Only wait 0 answers "not acquired" (a longer wait raises timeout):
		// the key stayed held for the whole (empty) wait.
		err = fmt.Errorf("acquire %q: held by another owner (wait %v): %w", key, wait, ErrWaitTimeout)
	}
	return g, err
}

func (c *Client) acquire(ctx context.Context, op, key, owner string, ttl, wait time.Duration) (Grant, bool, error) {
	t := Token{Key: key, Owner: owner}
	if err := checkTTL(op, t, "ttl", ttl, false); err != nil {
		return Grant{}, false, err
	}
	if err := checkTTL(op, t, "wait", wait, true); err != nil {
		return Grant{}, false, err
	}
	var (
		acquired  bool
		epoch     *int64
		expiresAt *time.Time
		serverNow time.Time
	)
	var sent, received time.Time
	query := func() error {
		epoch, expiresAt = nil, nil
		return c.onConn(ctx, op, func() Token {
			tt := t
			if epoch != nil {
				tt.Epoch = *epoch
			}
			return tt
		}, func(q Querier) error {
			sent = c.clock.Now()
			err := q.QueryRow(ctx,
				`SELECT a.acquired, a.epoch, a.expires_at, clock_timestamp() FROM lease.acquire($1, $2, $3, $4) a`,
				key, owner, ttl, wait).Scan(&acquired, &epoch, &expiresAt, &serverNow)
			received = c.clock.Now()
			return err
		})
	}
	var err error
	if wait == 0 {
		err = retryOnce(ctx, query)
	} else {
		err = query() // a retried wait could exceed the bound the caller set
	}
	if err != nil {
		return Grant{}, false, mapError(op, t, err)
	}
	if !acquired {
		if expiresAt != nil {
			// A denial that names an instant: the promotion grace (0.4.0).
			rt := roundTrip{sent: sent, received: received, serverNow: serverNow}
			return Grant{}, false, &GraceError{Key: key, Until: *expiresAt, UntilLocal: rt.latest(*expiresAt)}
		}
		return Grant{}, false, nil
	}
	t.Epoch = *epoch
	return newGrant(t, *expiresAt, ttl, sent, serverNow), true, nil
}

func newGrant(t Token, expiresAt time.Time, ttl time.Duration, sent, serverNow time.Time) Grant {
	rt := roundTrip{sent: sent, serverNow: serverNow}
	return Grant{Token: t, ExpiresAt: expiresAt, TTL: ttl, validUntil: rt.earliest(expiresAt)}
}

// Renew extends the grant t to server time + ttl; the epoch never changes.
// It returns an error matching ErrLost (and ErrNotOwner, ErrLapsed or
// ErrEpochMismatch) when t is no longer the current grant; then stop acting
// under t at once.
func (c *Client) Renew(ctx context.Context, t Token, ttl time.Duration) (Grant, error) {
	if err := checkTTL("renew", t, "ttl", ttl, false); err != nil {
		return Grant{}, err
	}
	var (
		status    string
		expiresAt *time.Time
		serverNow time.Time
	)
	var sent time.Time
	err := retryOnce(ctx, func() error {
		return c.onConn(ctx, "renew", func() Token { return t }, func(q Querier) error {
			sent = c.clock.Now()
			return q.QueryRow(ctx,
				`SELECT r.status, r.expires_at, clock_timestamp() FROM lease.renew($1, $2, $3, $4) r`,
				t.Key, t.Owner, t.Epoch, ttl).Scan(&status, &expiresAt, &serverNow)
		})
	})
	if err != nil {
		return Grant{}, mapError("renew", t, err)
	}
	if err := statusErr("renew", t, status); err != nil {
		return Grant{}, err
	}
	return newGrant(t, *expiresAt, ttl, sent, serverNow), nil
}

// Release ends the grant t: the key becomes free and its epoch counter moves
// past t.Epoch. Errors as for Renew. A release that fails on a dead
// connection is sent once more (see retryOnce): if the first one had
// committed, the second answers not_owner.
func (c *Client) Release(ctx context.Context, t Token) error {
	var status string
	err := retryOnce(ctx, func() error {
		return c.onConn(ctx, "release", func() Token { return t }, func(q Querier) error {
			return q.QueryRow(ctx, `SELECT lease.release($1, $2, $3)`, t.Key, t.Owner, t.Epoch).Scan(&status)
		})
	})
	if err != nil {
		return mapError("release", t, err)
	}
	return statusErr("release", t, status)
}

// Inspect reads key's state under lazy expiry. A never-leased key gives
// State{Exists: false} and no error.
func (c *Client) Inspect(ctx context.Context, key string) (State, error) {
	s := State{Key: key}
	err := retryOnce(ctx, func() error {
		s.rt.sent = c.clock.Now()
		err := scanState(c.db.QueryRow(ctx, `SELECT $1::text, i.held, i.owner, i.epoch, NULL::timestamptz,
		       i.expires_at, x.j->>'state', x.j->>'last_owner', (x.j->>'since')::timestamptz, clock_timestamp()
		  FROM lease.inspect($1) i, LATERAL (SELECT to_jsonb(i) AS j) x`, key).Scan, &s)
		s.rt.received = c.clock.Now()
		return err
	})
	s.rt.serverNow = s.ServerNow
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return State{Key: key}, nil
	case err != nil:
		return State{}, mapError("inspect", Token{Key: key}, err)
	}
	if s.Held {
		s.AcquiredAt = s.Since
	}
	return s, nil
}

// List returns the state of every key, ordered by key; given keys, of those
// keys only (one query; a key never leased has no entry, repeats count
// once). Before pg_lease 0.4.0, which lists only every key, the keys are
// picked out of that list; inside a transaction the first attempt's error
// then aborts it, and List returns the error.
func (c *Client) List(ctx context.Context, keys ...string) ([]State, error) {
	// to_jsonb: the columns of every SQL version (state, last_owner and
	// since are 0.4.0's).
	const cols = `SELECT l.key, l.held, l.owner, l.epoch, l.acquired_at, l.expires_at,
	       x.j->>'state', x.j->>'last_owner', (x.j->>'since')::timestamptz, clock_timestamp()`
	var (
		sent = c.clock.Now()
		rows pgx.Rows
		err  error
	)
	if len(keys) == 0 {
		rows, err = c.db.Query(ctx, cols+` FROM lease.list() l, LATERAL (SELECT to_jsonb(l) AS j) x`)
	} else {
		rows, err = c.db.Query(ctx, cols+` FROM lease.list($1::text[]) l, LATERAL (SELECT to_jsonb(l) AS j) x`, keys)
	}
	var out []State
	if err == nil {
		out, err = scanStates(rows, sent, c.clock)
	}
	var pg *pgconn.PgError
	if len(keys) > 0 && errors.As(err, &pg) && pg.Code == "42883" {
		// lease.list(text[]) does not exist: an older pg_lease.
		all, err := c.List(ctx)
		if err != nil {
			return nil, err
		}
		out = all[:0]
		for _, s := range all {
			if slices.Contains(keys, s.Key) {
				out = append(out, s)
			}
		}
		return out, nil
	}
	if err != nil {
		return nil, mapError("list", Token{}, err)
	}
	return out, nil
}

// scanStates reads List's rows, sent at sent on clk.
func scanStates(rows pgx.Rows, sent time.Time, clk clock.PassiveClock) ([]State, error) {
	defer rows.Close()
	var out []State
	for rows.Next() {
		s := State{rt: roundTrip{sent: sent}}
		if err := scanState(rows.Scan, &s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Every row's clock_timestamp() was read before the last row arrived.
	received := clk.Now()
	for i := range out {
		out[i].rt.received, out[i].rt.serverNow = received, out[i].ServerNow
	}
	return out, nil
}

// scanState scans one row of Inspect or List into s: key, held, owner,
// epoch, acquired_at, expires_at, state, last_owner, since, server time.
func scanState(scan func(dest ...any) error, s *State) error {
	var (
		owner, state, last           *string
		acquiredAt, expiresAt, since *time.Time
	)
	if err := scan(&s.Key, &s.Held, &owner, &s.Epoch, &acquiredAt, &expiresAt,
		&state, &last, &since, &s.ServerNow); err != nil {
		return err
	}
	s.Exists = true
	s.Owner, s.LastOwner = deref(owner), deref(last)
	s.AcquiredAt, s.ExpiresAt, s.Since = deref(acquiredAt), deref(expiresAt), deref(since)
	s.Lapsed, s.Released = !s.Held && deref(state) == "lapsed", !s.Held && deref(state) == "released"
	return nil
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// Fence asserts, inside tx (the caller's own transaction, in the same
// database as the leases), that t is the current unexpired grant, and keeps
// the key's row share-locked until tx ends: no takeover or release can
// commit before tx does, so writes made in tx after Fence returns are
// fenced. It returns the grant's server expiry, or an error matching ErrLost
// (tx is then aborted; roll it back).
func Fence(ctx context.Context, tx Querier, t Token) (time.Time, error) {
	var expiresAt time.Time
	err := tx.QueryRow(ctx, `SELECT lease.fence($1, $2, $3)`, t.Key, t.Owner, t.Epoch).Scan(&expiresAt)
	if err != nil {
		return time.Time{}, mapError("fence", t, err)
	}
	return expiresAt, nil
}

// Check asserts that t is the current unexpired grant: lease.fence in a
// statement of its own on the client's Querier, whose row lock ends with
// the statement; sent once more after a dead connection (fence changes
// nothing). It returns the grant's server expiry, or an error matching
// ErrLost. A grant under an owner string is the role's that took it, so
// Check tells whether a grant seen under this process's owner is this
// database role's.
func (c *Client) Check(ctx context.Context, t Token) (time.Time, error) {
	var expiresAt time.Time
	err := retryOnce(ctx, func() error {
		var err error
		expiresAt, err = Fence(ctx, c.db, t)
		return err
	})
	return expiresAt, err
}

package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// maxPriority is the highest candidate priority (PostgreSQL's integer).
const maxPriority = 2147483647

// ownKeys is how many keys of its own each hostile actor holds: the rest of
// its renew_many batches.
const ownKeys = 400

// querier is a connection or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// hconn is a hostile connection, known to the registry.
type hconn struct {
	conn *pgx.Conn
	pid  uint32
	reg  *registry
}

func (a *actor) connect(ctx context.Context) (*hconn, error) {
	conn, err := pgx.Connect(ctx, a.e.dsn(a.role))
	if err != nil {
		return nil, err
	}
	h := &hconn{conn: conn, pid: conn.PgConn().PID(), reg: a.e.reg}
	a.e.reg.add(h.pid, a.name, a.role)
	return h, nil
}

func (h *hconn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.conn.Close(ctx)
	h.reg.remove(h.pid)
}

// call runs f as one registered call on q (h's connection, or its open
// transaction).
func (h *hconn) call(ctx context.Context, q querier, desc string, keys []string, mayChange bool,
	f func(context.Context, querier) (changed bool, err error)) error {
	h.reg.start(h.pid, desc, keys, mayChange)
	changed, err := f(ctx, q)
	h.reg.finish(h.pid, changed)
	return err
}

// actor is one hostile client: a role acting at random, seeded.
type actor struct {
	e       *env
	name    string
	role    string
	rnd     *rand.Rand
	owner   string // its own owner string
	creator bool   // the role has CREATE on the database
	squat   bool   // candidacies and strategies on every honest key, kept up
	main    *hconn
	own     []string
	ownEp   []int64
}

// attackers returns the hostile actors of a run.
func (e *env) attackers(seed func() int64) []*actor {
	var out []*actor
	for _, role := range hostileRoles {
		for i := range 2 {
			a := &actor{e: e, role: role, name: fmt.Sprintf("%s#%d", role, i), rnd: rand.New(rand.NewSource(seed())),
				owner: fmt.Sprintf("%s-%d", role, i), creator: role == creatorRole && i == 0}
			out = append(out, a)
		}
	}
	// One more of eve2 keeps candidacies at the highest priority and
	// strategies on every honest key.
	out = append(out, &actor{e: e, role: "eve2", name: "eve2#squat", rnd: rand.New(rand.NewSource(seed())),
		owner: "eve2-squat", squat: true})
	return out
}

func (a *actor) run(ctx context.Context) error { return ignoreStop(ctx, a.act(ctx)) }

func (a *actor) act(ctx context.Context) error {
	var err error
	if a.main, err = a.connect(ctx); err != nil {
		return err
	}
	defer func() { a.main.close() }()
	if a.squat {
		return a.squatCandidacies(ctx)
	}
	if a.creator {
		if err := a.squatInstallerSchema(ctx); err != nil && ctx.Err() == nil {
			a.e.logf("%s: squatting: %v", a.name, err)
		}
	}
	if err := a.takeOwnKeys(ctx); err != nil && ctx.Err() == nil {
		a.e.logf("%s: own keys: %v", a.name, err)
	}
	actions := []struct {
		weight int
		f      func(context.Context) error
	}{
		{30, a.openTx},
		{10, a.renewManyBlast},
		{15, a.spoof},
		{10, a.forge},
		{10, a.flood},
		{5, a.listenChurn},
		{15, a.callLoop},
		{10, a.listenHold},
	}
	total := 0
	for _, x := range actions {
		total += x.weight
	}
	for ctx.Err() == nil {
		n := a.rnd.Intn(total)
		for _, x := range actions {
			if n -= x.weight; n < 0 {
				err = x.f(ctx)
				break
			}
		}
		if err != nil && ctx.Err() == nil {
			a.e.rec.Count("hostile: call errors", 1)
			if a.main.conn.IsClosed() {
				a.main.close()
				if a.main, err = a.connect(ctx); err != nil {
					return err
				}
			}
		}
		sleep(ctx, between(a.rnd, 0, 30*time.Millisecond))
	}
	return nil
}

// takeOwnKeys acquires the actor's own keys, held for the run.
func (a *actor) takeOwnKeys(ctx context.Context) error {
	keys := make([]string, ownKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/own/%d", a.owner, i)
	}
	rows, err := a.main.conn.Query(ctx, `SELECT k, (lease.acquire(k, $2, '10 minutes')).epoch FROM unnest($1::text[]) k`, keys, a.owner)
	if err != nil {
		return err
	}
	a.own, a.ownEp = nil, nil
	for rows.Next() {
		var (
			k  string
			ep *int64
		)
		if err := rows.Scan(&k, &ep); err != nil {
			rows.Close()
			return err
		}
		if ep != nil {
			a.own, a.ownEp = append(a.own, k), append(a.ownEp, *ep)
		}
	}
	return rows.Err()
}

// state is a key's state as any role reads it.
type state struct {
	held  bool
	owner string
	epoch int64
}

func (a *actor) states(ctx context.Context, q querier) (map[string]state, error) {
	rows, err := q.Query(ctx, `SELECT key, held, coalesce(owner, last_owner, ''), epoch FROM lease.list($1::text[])`, honestKeys())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]state{}
	for rows.Next() {
		var (
			k string
			s state
		)
		if err := rows.Scan(&k, &s.held, &s.owner, &s.epoch); err != nil {
			return nil, err
		}
		out[k] = s
	}
	return out, rows.Err()
}

func (a *actor) pick(list []string) string { return list[a.rnd.Intn(len(list))] }

// grantable lists the honest keys a hostile role may take grants of: every
// honest key but the probes (a probe's check needs no other grant on it).
func grantable() []string {
	var out []string
	for _, k := range honestKeys() {
		if !isProbeKey(k) {
			out = append(out, k)
		}
	}
	return out
}

// spoofOwner is an owner string to present on k: an honest identity of k,
// the key's current or last owner, or the actor's own.
func (a *actor) spoofOwner(k string, st state) string {
	switch n := a.rnd.Intn(4); {
	case n < 2 && len(spoofable[k]) > 0:
		return a.pick(spoofable[k])
	case n < 3 && st.owner != "":
		return st.owner
	}
	return a.owner
}

// openTx makes one call in a transaction and leaves it open for a while.
func (a *actor) openTx(ctx context.Context) error {
	h := a.main
	sts, err := a.states(ctx, h.conn)
	if err != nil {
		return err
	}
	tx, err := h.conn.Begin(ctx)
	if err != nil {
		return err
	}
	h.reg.begin(h.pid)
	defer h.reg.end(h.pid)
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if a.rnd.Intn(2) == 0 {
			_ = tx.Commit(ectx)
		} else {
			_ = tx.Rollback(ectx)
		}
	}()
	all := honestKeys()
	k := a.pick(all)
	st := sts[k]
	owner := a.spoofOwner(k, st)
	ep := max(st.epoch, 1)
	one := []string{k}
	switch a.rnd.Intn(11) {
	case 0:
		k = a.pick(grantable())
		st = sts[k]
		owner = a.spoofOwner(k, st)
		err = h.call(ctx, tx, fmt.Sprintf("acquire(%s, %s)", k, owner), []string{k}, true, func(ctx context.Context, q querier) (bool, error) {
			var ok bool
			err := q.QueryRow(ctx, `SELECT acquired FROM lease.acquire($1, $2, '3 seconds')`, k, owner).Scan(&ok)
			return ok, err
		})
	case 1:
		err = h.call(ctx, tx, fmt.Sprintf("renew(%s, %s, %d)", k, owner, ep), one, true, func(ctx context.Context, q querier) (bool, error) {
			var s string
			err := q.QueryRow(ctx, `SELECT status FROM lease.renew($1, $2, $3, '3 seconds')`, k, owner, ep).Scan(&s)
			return s == "ok", err
		})
	case 2:
		err = h.call(ctx, tx, fmt.Sprintf("release(%s, %s, %d)", k, owner, ep), one, true, func(ctx context.Context, q querier) (bool, error) {
			var s string
			err := q.QueryRow(ctx, `SELECT lease.release($1, $2, $3)`, k, owner, ep).Scan(&s)
			return s == "ok", err
		})
	case 3:
		err = h.call(ctx, tx, fmt.Sprintf("inspect(%s)", k), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT * FROM lease.inspect($1)`, k)
			return false, err
		})
	case 4:
		err = h.call(ctx, tx, "list()", all, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT * FROM lease.list()`)
			return false, err
		})
	case 5:
		err = h.call(ctx, tx, fmt.Sprintf("history(%s)", k), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT * FROM lease.history($1)`, k)
			return false, err
		})
	case 6:
		err = h.call(ctx, tx, fmt.Sprintf("listen(%s)", k), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT lease.listen($1)`, k)
			return false, err
		})
	case 7:
		err = h.call(ctx, tx, fmt.Sprintf("candidate(%s, %s, priority %d)", k, owner, maxPriority), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT * FROM lease.candidate($1, $2, '3 seconds', NULL, $3, true)`, k, owner, maxPriority)
			return false, err
		})
	case 8:
		err = h.call(ctx, tx, fmt.Sprintf("set_strategy(%s, priority)", k), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT lease.set_strategy($1, 'priority')`, k)
			return false, err
		})
	case 9:
		keys, eps := a.batch(sts)
		err = h.call(ctx, tx, fmt.Sprintf("renew_many(%d keys, every honest one)", len(keys)), all, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT * FROM lease.renew_many($1::text[], $2, $3::bigint[], '10 minutes')`, keys, a.owner, eps)
			return false, err
		})
	case 10:
		err = h.call(ctx, tx, fmt.Sprintf("fence(%s, %s, %d)", k, owner, ep), one, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT lease.fence($1, $2, $3)`, k, owner, ep)
			return false, err
		})
	}
	a.e.rec.Count("hostile: open transactions", 1)
	sleep(ctx, between(a.rnd, 100*time.Millisecond, 2*time.Second))
	return ignoreRefusal(err)
}

// ignoreRefusal drops the errors a hostile call is expected to meet: the
// server's refusals (permission, bad state) are what is being tried.
func ignoreRefusal(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return nil
	}
	return err
}

// batch is a renew_many batch: every honest key (at the epoch it was last
// seen with) and the actor's own keys, renewed by it, at most 1000.
func (a *actor) batch(sts map[string]state) ([]string, []int64) {
	var keys []string
	var eps []int64
	for _, k := range honestKeys() {
		keys = append(keys, k)
		eps = append(eps, max(sts[k].epoch, 1))
	}
	n := min(len(a.own), 1000-len(keys))
	return append(keys, a.own[:n]...), append(eps, a.ownEp[:n]...)
}

// callLoop calls one entry point that grants nothing, over and over for a
// while, on every honest key or on one probe key (under their current
// owners and epochs, or its own owner string): renew, release, fence or
// listen, each refused or a no-op for this role, in one statement.
func (a *actor) callLoop(ctx context.Context) error {
	h := a.main
	sts, err := a.states(ctx, h.conn)
	if err != nil {
		return err
	}
	var calls []string
	fn := a.pick([]string{"renew", "release", "fence", "listen"})
	keys, over := honestKeys(), "every honest key"
	if a.rnd.Intn(2) == 0 {
		// One probe key: where check (1) looks.
		k := a.pick(probeKeys)
		keys, over = []string{k}, k
	}
	for _, k := range keys {
		st := sts[k]
		owner, ep := a.spoofOwner(k, st), max(st.epoch, 1)
		switch fn {
		case "renew":
			calls = append(calls, fmt.Sprintf("PERFORM lease.renew(%s, %s, %d, '3 seconds');", literal(k), literal(owner), ep))
		case "release":
			calls = append(calls, fmt.Sprintf("PERFORM lease.release(%s, %s, %d);", literal(k), literal(owner), ep))
		case "fence":
			calls = append(calls, fmt.Sprintf("PERFORM lease.fence(%s, %s, %d);", literal(k), literal(owner), ep))
		case "listen":
			calls = append(calls, fmt.Sprintf("PERFORM lease.listen(%s);", literal(k)))
		}
	}
	var body strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&body, "BEGIN %s EXCEPTION WHEN OTHERS THEN NULL; END;\n", c)
	}
	d := between(a.rnd, 300*time.Millisecond, 1500*time.Millisecond)
	stmt := fmt.Sprintf(`DO $loop$ DECLARE t timestamptz := clock_timestamp() + interval '%d milliseconds';
BEGIN WHILE clock_timestamp() < t LOOP
%s
END LOOP; END $loop$`, d.Milliseconds(), body.String())
	err = h.call(ctx, h.conn, fmt.Sprintf("a loop of %s over %s", fn, over), keys, false, func(ctx context.Context, q querier) (bool, error) {
		_, err := q.Exec(ctx, stmt)
		return false, err
	})
	a.e.rec.Count("hostile: call loops", 1)
	return ignoreRefusal(err)
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// renewManyBlast renews the actor's own keys, with every honest key in the
// batch, several times in a row.
func (a *actor) renewManyBlast(ctx context.Context) error {
	h := a.main
	sts, err := a.states(ctx, h.conn)
	if err != nil {
		return err
	}
	keys, eps := a.batch(sts)
	n := 5 + a.rnd.Intn(15)
	for range n {
		err := h.call(ctx, h.conn, fmt.Sprintf("renew_many(%d keys, every honest one)", len(keys)), honestKeys(), false,
			func(ctx context.Context, q querier) (bool, error) {
				_, err := q.Exec(ctx, `SELECT * FROM lease.renew_many($1::text[], $2, $3::bigint[], '10 minutes')`, keys, a.owner, eps)
				return false, err
			})
		if err != nil || ctx.Err() != nil {
			return ignoreRefusal(err)
		}
	}
	a.e.rec.Count("hostile: renew_many batches", n)
	return nil
}

// spoof takes an honest key, when it is free, under an honest process's
// identity, and holds it a while: reacting to the release's notification
// as fast as the honest followers do.
func (a *actor) spoof(ctx context.Context) error {
	keys := []string{electorKey, clientGoKey, handoverKey}
	k := a.pick(keys)
	id := a.pick(spoofable[k])
	h, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer h.close()
	if _, err := h.conn.Exec(ctx, `LISTEN pg_lease`); err != nil {
		return err
	}
	var epoch int64
	until := a.e.rec.Now() + between(a.rnd, 500*time.Millisecond, 2*time.Second)
	for epoch == 0 && a.e.rec.Now() < until && ctx.Err() == nil {
		err := h.call(ctx, h.conn, fmt.Sprintf("acquire(%s, %s)", k, id), []string{k}, true, func(ctx context.Context, q querier) (bool, error) {
			var ep *int64
			err := q.QueryRow(ctx, `SELECT epoch FROM lease.acquire($1, $2, '3 seconds')`, k, id).Scan(&ep)
			if ep != nil {
				epoch = *ep
			}
			return ep != nil, err
		})
		if err != nil {
			return ignoreRefusal(err)
		}
		if epoch == 0 {
			wctx, cancel := context.WithTimeout(ctx, between(a.rnd, 5*time.Millisecond, 30*time.Millisecond))
			_, _ = h.conn.WaitForNotification(wctx)
			cancel()
		}
	}
	if epoch == 0 {
		return nil
	}
	a.e.rec.Count("hostile: honest keys held under an honest identity", 1)
	hold := a.e.rec.Now() + between(a.rnd, 1500*time.Millisecond, 5*time.Second)
	for a.e.rec.Now() < hold && sleep(ctx, 700*time.Millisecond) {
		var s string
		if err := h.conn.QueryRow(ctx, `SELECT status FROM lease.renew($1, $2, $3, '3 seconds')`, k, id, epoch).Scan(&s); err != nil || s != "ok" {
			return ignoreRefusal(err)
		}
	}
	if a.rnd.Intn(10) < 7 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = h.conn.Exec(rctx, `SELECT lease.release($1, $2, $3)`, k, id, epoch)
	}
	return nil
}

// notification is the payload pg_lease sends on channel pg_lease.
type notification struct {
	Event string `json:"event"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
}

// forge sends pg_lease notifications that no change made: releases,
// grants and handovers of honest keys, with made-up epochs.
func (a *actor) forge(ctx context.Context) error {
	h := a.main
	sts, err := a.states(ctx, h.conn)
	if err != nil {
		return err
	}
	events := []string{"released", "acquired", "handover", "force_released"}
	n := 3 + a.rnd.Intn(10)
	for range n {
		k := a.pick([]string{electorKey, clientGoKey, handoverKey, fmt.Sprintf("%s/shard/%d", shardController, a.rnd.Intn(shardCount))})
		st := sts[k]
		var ep int64
		switch a.rnd.Intn(3) {
		case 0:
			ep = st.epoch + 1 + a.rnd.Int63n(1000)
		case 1:
			ep = max(st.epoch-1-a.rnd.Int63n(5), 1)
		default:
			ep = 1 << 50
		}
		payload, _ := json.Marshal(notification{Event: a.pick(events), Key: k, Owner: a.spoofOwner(k, st), Epoch: ep})
		if _, err := h.conn.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, string(payload)); err != nil {
			return ignoreRefusal(err)
		}
	}
	a.e.rec.Count("hostile: forged notifications", n)
	return nil
}

// flood runs acquire/release cycles on a free honest key: each adds two
// events to the key's history.
func (a *actor) flood(ctx context.Context) error {
	h := a.main
	sts, err := a.states(ctx, h.conn)
	if err != nil {
		return err
	}
	var free []string
	for _, k := range grantable() {
		if st, ok := sts[k]; ok && !st.held {
			free = append(free, k)
		}
	}
	if len(free) == 0 {
		return nil
	}
	k := a.pick(free)
	n := 20 + a.rnd.Intn(40)
	done := 0
	for range n {
		var ep *int64
		err := h.call(ctx, h.conn, fmt.Sprintf("acquire(%s, %s)", k, a.owner), []string{k}, true, func(ctx context.Context, q querier) (bool, error) {
			err := q.QueryRow(ctx, `SELECT epoch FROM lease.acquire($1, $2, '1 second')`, k, a.owner).Scan(&ep)
			return ep != nil, err
		})
		if err != nil {
			return ignoreRefusal(err)
		}
		if ep == nil {
			// Held, or locked for a moment: try again shortly.
			if !sleep(ctx, between(a.rnd, 10*time.Millisecond, 50*time.Millisecond)) {
				break
			}
			continue
		}
		err = h.call(ctx, h.conn, fmt.Sprintf("release(%s, %s, %d)", k, a.owner, *ep), []string{k}, true, func(ctx context.Context, q querier) (bool, error) {
			var s string
			err := q.QueryRow(ctx, `SELECT lease.release($1, $2, $3)`, k, a.owner, *ep).Scan(&s)
			return s == "ok", err
		})
		if err != nil {
			return ignoreRefusal(err)
		}
		done++
	}
	a.e.rec.Count("hostile: history flood cycles", done)
	return nil
}

// listenChurn registers a connection for most of a session's worth of
// keys in one statement, then for every honest key, one call at a time,
// keeps the transaction open a while, commits, and disconnects: the
// registrations of a backend that is gone, which every later listen
// cleans up.
func (a *actor) listenChurn(ctx context.Context) error {
	h, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer h.close()
	var keys []string
	for len(keys) < 900 {
		keys = append(keys, fmt.Sprintf("%s/listen/%d", a.owner, a.rnd.Intn(100000)))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	tx, err := h.conn.Begin(ctx)
	if err != nil {
		return err
	}
	h.reg.begin(h.pid)
	defer h.reg.end(h.pid)
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Commit(ectx)
	}()
	err = h.call(ctx, tx, fmt.Sprintf("listen(%d keys of its own)", len(keys)), nil, false, func(ctx context.Context, q querier) (bool, error) {
		_, err := q.Exec(ctx, `SELECT count(lease.listen(k)) FROM unnest($1::text[]) k`, keys)
		return false, err
	})
	for _, k := range honestKeys() {
		if err != nil || ctx.Err() != nil {
			break
		}
		err = h.call(ctx, tx, fmt.Sprintf("listen(%s)", k), []string{k}, false, func(ctx context.Context, q querier) (bool, error) {
			_, err := q.Exec(ctx, `SELECT lease.listen($1)`, k)
			return false, err
		})
	}
	sleep(ctx, between(a.rnd, 300*time.Millisecond, 2*time.Second))
	a.e.rec.Count("hostile: listen churns", 1)
	return ignoreRefusal(err)
}

// listenHold calls listen once, for one honest key, and keeps the
// transaction open a while.
func (a *actor) listenHold(ctx context.Context) error {
	h := a.main
	k := a.pick(honestKeys())
	tx, err := h.conn.Begin(ctx)
	if err != nil {
		return err
	}
	h.reg.begin(h.pid)
	defer h.reg.end(h.pid)
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Commit(ectx)
	}()
	err = h.call(ctx, tx, fmt.Sprintf("listen(%s)", k), []string{k}, false, func(ctx context.Context, q querier) (bool, error) {
		_, err := q.Exec(ctx, `SELECT lease.listen($1)`, k)
		return false, err
	})
	sleep(ctx, between(a.rnd, 500*time.Millisecond, 3*time.Second))
	a.e.rec.Count("hostile: listens held open", 1)
	return ignoreRefusal(err)
}

// squatCandidacies keeps a candidate at the highest priority on every
// honest key, under an honest identity where one is known (its own
// otherwise), and sets the priority strategy on each: first at the start,
// before the honest parts set theirs.
func (a *actor) squatCandidacies(ctx context.Context) error {
	h := a.main
	for ctx.Err() == nil {
		sts, err := a.states(ctx, h.conn)
		if err != nil {
			return ignoreRefusal(err)
		}
		for _, k := range honestKeys() {
			if _, err := h.conn.Exec(ctx, `SELECT lease.set_strategy($1, 'priority')`, k); ignoreRefusal(err) != nil {
				return err
			}
			owners := []string{a.owner}
			if ids := spoofable[k]; len(ids) > 0 {
				owners = append([]string{a.pick(ids)}, owners...)
			} else if st := sts[k]; st.owner != "" {
				owners = append([]string{st.owner}, owners...)
			}
			for _, o := range owners {
				var s string
				err := h.call(ctx, h.conn, fmt.Sprintf("candidate(%s, %s, priority %d)", k, o, maxPriority), []string{k}, false,
					func(ctx context.Context, q querier) (bool, error) {
						err := q.QueryRow(ctx, `SELECT status FROM lease.candidate($1, $2, '4 seconds', NULL, $3, true)`, k, o, maxPriority).Scan(&s)
						return false, err
					})
				if ignoreRefusal(err) != nil {
					return err
				}
				if s == "ok" {
					break
				}
			}
		}
		a.e.rec.Count("hostile: candidacy rounds", 1)
		sleep(ctx, between(a.rnd, 500*time.Millisecond, 1500*time.Millisecond))
	}
	return nil
}

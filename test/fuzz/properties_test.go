package fuzz

// Properties that the mutation pass (hack/mutate.py, docs/audit/defects.md) found
// no suite checking: each test here kills the mutants named in its comment.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// TestNotifySwitchValues: every spelling of "off" that lease._changed
// documents (off, false, no, 0, f, n, any case) turns notifications off for
// the session; every spelling of "on" (on, always, true, yes, 1, t, y)
// notifies always; anything else (unset, waiters, unknown: the 0.3.0
// default) notifies only keys a backend registered with lease.listen, which
// this listener does not. Kills _changed.inlist.* (one value dropped from
// the list).
func TestNotifySwitchValues(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	payload := h.listen(t, ctx)
	conn := h.connect(t, ctx)
	cycle := func(key string) { // a grant and a release: two notifications unless off
		t.Helper()
		var epoch int64
		if err := conn.QueryRow(ctx, "SELECT epoch FROM lease.acquire($1, 'o', '1h')", key).Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		var st string
		if err := conn.QueryRow(ctx, "SELECT lease.release($1, 'o', $2)", key, epoch).Scan(&st); err != nil || st != "ok" {
			t.Fatal(st, err)
		}
	}
	next := func() string { // the next notification's key
		t.Helper()
		p := payload()
		i := strings.Index(p, `"key" : "`)
		if i < 0 {
			t.Fatalf("payload %q", p)
		}
		rest := p[i+len(`"key" : "`):]
		return rest[:strings.IndexByte(rest, '"')]
	}
	// 0.3.0: unset, waiters and any unknown value notify only where a
	// backend registered with lease.listen (this listener does not).
	for i, v := range []string{"off", "false", "no", "0", "f", "n", "OFF", "False", "NO", "F", "N", "", "offf", "waiters"} {
		if _, err := conn.Exec(ctx, "SELECT set_config('pg_lease.notify', $1, false)", v); err != nil {
			t.Fatal(err)
		}
		cycle("quiet")
		if _, err := conn.Exec(ctx, "SELECT set_config('pg_lease.notify', 'on', false)"); err != nil {
			t.Fatal(err)
		}
		marker := "marker-" + string(rune('a'+i))
		cycle(marker)
		// Notifications arrive in commit order: the first one after a quiet
		// cycle must be the marker's grant.
		if k := next(); k != marker {
			t.Fatalf("pg_lease.notify = %q: got a notification for %q before the marker's", v, k)
		}
		if k := next(); k != marker {
			t.Fatalf("pg_lease.notify = %q: second notification for %q, want the marker's release", v, k)
		}
	}
	for _, v := range []string{"on", "true", "yes", "1", "always", "ALWAYS", "t", "y"} {
		if _, err := conn.Exec(ctx, "SELECT set_config('pg_lease.notify', $1, false)", v); err != nil {
			t.Fatal(err)
		}
		cycle("loud")
		if k := next(); k != "loud" {
			t.Fatalf("pg_lease.notify = %q: notification for %q, want loud", v, k)
		}
		if k := next(); k != "loud" {
			t.Fatalf("pg_lease.notify = %q: notification for %q, want loud", v, k)
		}
	}
}

// TestDurationBoundIsTheClockAtTheCall: a duration (here acquire's wait; a
// ttl has the same check, and a maximum of its own from 0.3.0) must leave
// server time + duration at least one second inside timestamptz's range,
// measured with the clock at the call (not the transaction's or the
// statement's start). A wait 0.5 s short of the bound is refused, 1.5 s
// short is accepted (the key is free: no waiting), also after the
// transaction and the statement have lasted 2 s. Kills
// _duration_violation.int.* (the spare second off by one) and
// _duration_violation.clock.* (now() or statement_timestamp() for the
// clock). (The >= vs > of the same comparison differs only at one exact
// microsecond and is listed as equivalent.)
func TestDurationBoundIsTheClockAtTheCall(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	// In one DO block in one transaction: the transaction and the statement
	// start, 2 s pass, then wait = bound - clock - short.
	call := func(key string, short float64) (string, error) {
		t.Helper()
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		_, err = tx.Exec(ctx, `DO $$
DECLARE
  v_wait interval;
  r record;
BEGIN
  PERFORM pg_sleep(2);
  v_wait := make_interval(secs => extract(epoch FROM timestamptz '294276-12-31 23:59:59+00')
                                 - extract(epoch FROM clock_timestamp()) - `+strconv.FormatFloat(short, 'f', -1, 64)+`);
  SELECT * INTO r FROM lease.acquire('`+key+`', 'o', '1 millisecond', v_wait);
  IF NOT r.acquired THEN RAISE EXCEPTION 'not acquired'; END IF;
END
$$`)
		if err != nil {
			if pg := pgErr(err); pg != nil {
				return pg.Code, nil
			}
			return "", err
		}
		return "ok", nil
	}
	if got, err := call("bound-far", 1.5); err != nil || got != "ok" {
		t.Fatalf("wait 1.5 s inside the bound: %s %v, want accepted", got, err)
	}
	if got, err := call("bound-near", 0.5); err != nil || got != "22023" {
		t.Fatalf("wait 0.5 s inside the bound (one-second spare): %s %v, want 22023", got, err)
	}
}

// TestOtherRolesPrivileges: a role with no grants may execute the API
// (rules.publicFunctions) and use schema lease, and nothing else: no
// internal helper (lease._*), no operator function (rules.operatorFunctions),
// no privilege on any table of the schema, no CREATE in it. Kills the
// deletion (and the inversion to GRANT ... TO PUBLIC) of each REVOKE of the
// install and update scripts; the regression suite checks only some of the
// objects one by one.
//
// Also with default privileges of the installing role granting everything
// to PUBLIC (and, from the version whose rules say so, to a named role):
// the scripts' own REVOKEs must undo them. (Kills the deletion of REVOKE
// ALL ON SCHEMA/TABLE ... FROM PUBLIC, which without default privileges
// changes nothing.)
func TestOtherRolesPrivileges(t *testing.T) {
	ctx := ctxFor(t)
	role := "fuzz_no_grants"
	for _, r := range []string{role, "fuzz_app_rw"} {
		if err := pgtest.Shared(t).CreateRole(ctx, r, ""); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
	t.Run("plain", func(t *testing.T) { checkOtherRoles(t, newHarness(t), role) })
	grantAll := func(to string) string {
		return `ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO ` + to + `;
			ALTER DEFAULT PRIVILEGES GRANT ALL ON SEQUENCES TO ` + to + `;
			ALTER DEFAULT PRIVILEGES GRANT ALL ON FUNCTIONS TO ` + to + `;
			ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO ` + to + `;`
	}
	t.Run("default privileges to PUBLIC", func(t *testing.T) {
		checkOtherRoles(t, newHarnessWith(t, grantAll("PUBLIC")), role)
	})
	t.Run("default privileges to a role", func(t *testing.T) {
		h := newHarnessWith(t, grantAll("fuzz_app_rw"))
		if h.rules.defaultPrivilegesLeak {
			t.Logf("pg_lease %s: default privileges granted to a role leak into its objects (known before 0.3.0); checking PUBLIC only", h.version)
			checkOtherRoles(t, h, role)
			return
		}
		checkOtherRoles(t, h, "fuzz_app_rw")
	})
}

func checkOtherRoles(t *testing.T, h *harness, role string) {
	ctx := ctxFor(t)
	open := map[string]bool{}
	for _, f := range h.rules.publicFunctions {
		open[f] = true
	}
	closed := map[string]bool{}
	for _, f := range h.rules.operatorFunctions {
		closed[f] = true
	}
	rows, err := h.pool.Query(ctx, `SELECT p.proname, p.oid::regprocedure::text, has_function_privilege($1, p.oid, 'EXECUTE')
		FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace ORDER BY 2`, role)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		Name, Sig string
		Exec      bool
	}
	fns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fn])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fns {
		seen[f.Name] = true
		switch {
		case open[f.Name] && !f.Exec:
			t.Errorf("%s: a role with no grants cannot execute it (an API function)", f.Sig)
		case (strings.HasPrefix(f.Name, "_") || closed[f.Name]) && f.Exec:
			t.Errorf("%s: a role with no grants can execute it (internal or operator function)", f.Sig)
		case !open[f.Name] && !closed[f.Name] && !strings.HasPrefix(f.Name, "_"):
			t.Logf("%s: neither API nor operator function in the fuzz rules of %s (executable: %v)", f.Sig, h.version, f.Exec)
		}
	}
	for _, f := range append(append([]string{}, h.rules.publicFunctions...), h.rules.operatorFunctions...) {
		if !seen[f] {
			t.Errorf("lease.%s does not exist in %s", f, h.version)
		}
	}
	var tables []string
	rows, err = h.pool.Query(ctx, `SELECT c.oid::regclass::text FROM pg_class c
		WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'S', 'p') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(tables) == 0 {
		t.Fatal("no table in schema lease")
	}
	for _, tb := range tables {
		for _, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"} {
			var has bool
			if err := h.pool.QueryRow(ctx, "SELECT has_table_privilege($1, $2, $3)", role, tb, priv).Scan(&has); err != nil {
				t.Fatal(err)
			}
			if has {
				t.Errorf("a role with no grants has %s on %s", priv, tb)
			}
		}
	}
	var usage, create bool
	if err := h.pool.QueryRow(ctx, "SELECT has_schema_privilege($1, 'lease', 'USAGE'), has_schema_privilege($1, 'lease', 'CREATE')",
		role).Scan(&usage, &create); err != nil {
		t.Fatal(err)
	}
	if !usage || create {
		t.Errorf("schema lease: USAGE %v (want true), CREATE %v (want false) for a role with no grants", usage, create)
	}
}

// TestConcurrentCleanupsKeepTheHighestFloor: two clean-ups at once, each
// removing a different key, leave the epoch floor at the highest epoch
// either removed, whichever commits last. The floor row's lock serializes
// them; without it (cleanup.lock.8, cleanup's FOR UPDATE on lease.epoch_floor
// removed) the second one, having read the floor before the first
// committed, writes its own lower maximum over the first's, and a key the
// first removed could be granted an epoch it already had.
func TestConcurrentCleanupsKeepTheHighestFloor(t *testing.T) {
	h := newHarness(t)
	if !h.hasCleanup(t) {
		return
	}
	ctx := ctxFor(t)
	c := h.client
	h.cycle(t, ctx, "floor-a", 5) // free, counter 10
	gb := h.grant(t, ctx, "floor-b", "o")
	t1 := h.begin(t, ctx)
	var removed, floor int64
	if err := t1.QueryRow(ctx, "SELECT removed, epoch_floor FROM lease.cleanup('0')").Scan(&removed, &floor); err != nil {
		t.Fatal(err)
	}
	if removed != 1 || floor != 10 {
		t.Fatalf("first clean-up: removed %d, floor %d; want 1, 10", removed, floor)
	}
	if err := c.Release(ctx, gb.Token); err != nil { // floor-b free now, counter 2
		t.Fatal(err)
	}
	conn2, pid := h.backend(t, ctx)
	done := async(func() error {
		_, err := conn2.Exec(ctx, "SELECT lease.cleanup('0')")
		return err
	})
	// The second clean-up either waits for the first (0.2.0: on the floor
	// row) or finishes on its own; then the first commits.
	err, finished := awaitWaiting(t, h, ctx, pid, false, done)
	if finished && err != nil {
		t.Fatal(err)
	}
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := h.pool.QueryRow(ctx, "SELECT max(floor) FROM lease.epoch_floor").Scan(&floor); err != nil {
		t.Fatal(err)
	}
	if floor != 10 {
		t.Fatalf("floor after both clean-ups: %d, want 10 (the highest epoch removed)", floor)
	}
	g, ok, err := c.Acquire(ctx, "floor-a", "o", time.Hour)
	if err != nil || !ok || g.Epoch <= 10 {
		t.Fatalf("floor-a after clean-up: %v %v %v, want an epoch above 10", g.Token, ok, err)
	}
}

// TestFirstGrantAboveAFloorRaisedWhileItWaited: a first grant that waited
// for another session's uncommitted first grant of the same key (which then
// rolled back) carries an epoch above the epoch floor as it is when the
// grant is made, not as it was when its INSERT began: a clean-up of another
// key committed during the wait raised it. Kills acquire.stmt.7 (the
// re-read of the floor after the INSERT, and the UPDATE above it, removed).
func TestFirstGrantAboveAFloorRaisedWhileItWaited(t *testing.T) {
	h := newHarness(t)
	if !h.hasCleanup(t) {
		return
	}
	ctx := ctxFor(t)
	h.cycle(t, ctx, "floor-z", 10) // key z: free, counter 20
	tx := h.begin(t, ctx)
	var first int64
	if err := tx.QueryRow(ctx, "SELECT epoch FROM lease.acquire('floor-k', 'x', '1 hour')").Scan(&first); err != nil {
		t.Fatal(err)
	}
	conn, pid := h.backend(t, ctx)
	type res struct {
		ok    bool
		epoch *int64
		err   error
	}
	// the second first grant waits for the uncommitted one (on its lock, or polling)
	done := mustWait(t, h, ctx, pid, true, "the second first grant (for the uncommitted one)", func() (r res) {
		// a blocking acquire: from 0.3.0 a wait-0 one no longer waits for
		// an uncommitted first grant
		r.err = conn.QueryRow(ctx, "SELECT acquired, epoch FROM lease.acquire('floor-k', 'a', '1 hour', '30 s')").Scan(&r.ok, &r.epoch)
		return r
	})
	var floor int64
	if err := h.pool.QueryRow(ctx, "SELECT epoch_floor FROM lease.cleanup('0')").Scan(&floor); err != nil {
		t.Fatal(err)
	}
	if floor < 20 {
		t.Fatalf("floor after removing floor-z: %d, want at least 20", floor)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.ok || r.epoch == nil || *r.epoch <= floor {
		t.Fatalf("first grant after the floor rose to %d during its wait: acquired=%v epoch=%s err=%v; want an epoch above the floor",
			floor, r.ok, showInt(r.epoch), r.err)
	}
}

// TestClockIsReadAtTheCallInsideOneStatement: every decision and every
// recorded time uses the clock at the call, also when the call comes late
// in one long statement (a DO block, a function of the application): there
// statement_timestamp(), like now(), is the statement's start. In one DO
// block, 0.5 s after the block began: a 0.3 s grant made at its start is
// lapsed for inspect, list, renew, release and fence; another owner takes
// it over, and a first grant, a renewal, a release, a force-release and a
// clean-up record times measured from the clock. Kills the *.clock.2
// mutants (clock_timestamp() -> statement_timestamp()) the per-statement
// tests of sql/test cannot see.
func TestClockIsReadAtTheCallInsideOneStatement(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	cleanup := ""
	if h.rules.hasCleanup {
		cleanup = `
  -- clean-up: 'stmt-free' was released 0.5 s after the statement began;
  -- free_for 0.3 s measured from the clock removes it
  PERFORM pg_sleep(0.5);
  SELECT * INTO c FROM lease.cleanup('0.3 s');
  IF EXISTS (SELECT 1 FROM lease.inspect('stmt-free')) THEN
    RAISE EXCEPTION 'cleanup kept a key free for 0.5 s with free_for 0.3 s';
  END IF;`
	}
	tx := h.begin(t, ctx)
	// a mutant that loops forever ends here, not at the test's deadline
	if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '20s'"); err != nil {
		t.Fatal(err)
	}
	_, err := tx.Exec(ctx, `DO $$
DECLARE
  a record; r record; s text; e timestamptz; n bigint; c record;
BEGIN
  SELECT * INTO a FROM lease.acquire('stmt-k', 'o', '0.3 s');
  PERFORM lease.acquire('stmt-held', 'h', '2.5 s');
  PERFORM pg_sleep(0.5);
  SELECT * INTO r FROM lease.inspect('stmt-k');
  IF r.held THEN RAISE EXCEPTION 'inspect: a 0.3 s grant is held 0.5 s later'; END IF;
  SELECT * INTO r FROM lease.list() l WHERE l.key = 'stmt-k';
  IF r.held THEN RAISE EXCEPTION 'list: a 0.3 s grant is held 0.5 s later'; END IF;
  SELECT status INTO s FROM lease.renew('stmt-k', 'o', a.epoch, '1 s');
  IF s <> 'lapsed' THEN RAISE EXCEPTION 'renew of a lapsed grant: %', s; END IF;
  SELECT lease.release('stmt-k', 'o', a.epoch) INTO s;
  IF s <> 'lapsed' THEN RAISE EXCEPTION 'release of a lapsed grant: %', s; END IF;
  BEGIN
    PERFORM lease.fence('stmt-k', 'o', a.epoch);
    RAISE EXCEPTION 'fence of a lapsed grant succeeded';
  EXCEPTION WHEN SQLSTATE '55000' THEN
    IF SQLERRM <> 'lapsed' THEN RAISE EXCEPTION 'fence of a lapsed grant: %', SQLERRM; END IF;
  END;
  -- takeover and first grant: expiry from the clock
  SELECT * INTO r FROM lease.acquire('stmt-k', 'p', '1 s');
  IF NOT r.acquired OR r.expires_at < clock_timestamp() + interval '0.9 s' THEN
    RAISE EXCEPTION 'takeover: acquired % expires % (clock %)', r.acquired, r.expires_at, clock_timestamp();
  END IF;
  SELECT * INTO r FROM lease.acquire('stmt-new', 'p', '1 s');
  IF NOT r.acquired OR r.expires_at < clock_timestamp() + interval '0.9 s' THEN
    RAISE EXCEPTION 'first grant: expires % (clock %)', r.expires_at, clock_timestamp();
  END IF;
  n := r.epoch;
  PERFORM pg_sleep(0.2);
  SELECT * INTO r FROM lease.renew('stmt-new', 'p', n, '1 s');
  IF r.status <> 'ok' OR r.expires_at < clock_timestamp() + interval '0.9 s' THEN
    RAISE EXCEPTION 'renew: % expires % (clock %)', r.status, r.expires_at, clock_timestamp();
  END IF;
  -- a blocking acquire's deadline runs from the call: 1.5 s after it the
  -- holder's grant ends, inside its wait of 2 s (from the statement's
  -- start the wait would have ended 1 s after the call)
  PERFORM pg_sleep(greatest(0, 1 - extract(epoch FROM clock_timestamp() - statement_timestamp())));
  SELECT * INTO r FROM lease.acquire('stmt-held', 'w', '1 s', '2 s');
  IF NOT r.acquired THEN RAISE EXCEPTION 'blocking acquire: not acquired'; END IF;
  -- a blocking acquire of a free key, late in the statement
  SELECT * INTO r FROM lease.acquire('stmt-wait', 'p', '1 s', '1 s');
  IF NOT r.acquired OR r.expires_at < clock_timestamp() + interval '0.9 s' THEN
    RAISE EXCEPTION 'blocking acquire: expires % (clock %)', r.expires_at, clock_timestamp();
  END IF;
  -- release and force-release record the clock: the key is free since then
  SELECT * INTO r FROM lease.acquire('stmt-free', 'p', '1 hour');
  SELECT lease.release('stmt-free', 'p', r.epoch) INTO s;
  SELECT * INTO r FROM lease.acquire('stmt-forced', 'p', '1 hour');
  PERFORM lease.force_release('stmt-forced');
  SELECT expires_at INTO e FROM lease.leases WHERE key = 'stmt-free';
  IF e < clock_timestamp() - interval '0.1 s' THEN RAISE EXCEPTION 'release time % (clock %)', e, clock_timestamp(); END IF;
  SELECT expires_at INTO e FROM lease.leases WHERE key = 'stmt-forced';
  IF e < clock_timestamp() - interval '0.1 s' THEN RAISE EXCEPTION 'force_release time % (clock %)', e, clock_timestamp(); END IF;`+cleanup+`
END
$$`)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNotificationPayloads: each change announces itself on channel
// pg_lease with the documented JSON payload: a grant (event acquired: the
// new holder and epoch), a release (released: the releasing holder and the
// epoch it ended), a force-release (force_released: the previous holder and
// the ended epoch); a renewal announces nothing. Kills the str mutants of
// the event names (force_release.str.2, ...) that notify.spec does not
// cover.
func TestNotificationPayloads(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	// 0.3.0: by default only registered keys notify (lease.listen).
	next := h.listen(t, ctx, "SELECT lease.listen('pay-k')")
	c := h.client
	g := h.grant(t, ctx, "pay-k", "alice")
	if _, err := c.Renew(ctx, g.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	// a force-release of a free key changes nothing and announces nothing
	// (kills force_release.stmt.9: its early RETURN removed)
	if released, _, _, err := leaseadmin.ForceRelease(ctx, c, "pay-k"); err != nil || released {
		t.Fatal(released, err)
	}
	g2 := h.grant(t, ctx, "pay-k", "bob")
	if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "pay-k"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`{"event" : "acquired", "key" : "pay-k", "owner" : "alice", "epoch" : ` + strconv.FormatInt(g.Epoch, 10) + `}`,
		`{"event" : "released", "key" : "pay-k", "owner" : "alice", "epoch" : ` + strconv.FormatInt(g.Epoch, 10) + `}`,
		`{"event" : "acquired", "key" : "pay-k", "owner" : "bob", "epoch" : ` + strconv.FormatInt(g2.Epoch, 10) + `}`,
		`{"event" : "force_released", "key" : "pay-k", "owner" : "bob", "epoch" : ` + strconv.FormatInt(g2.Epoch, 10) + `}`,
	} {
		if got := next(); got != want {
			t.Fatalf("notification %s, want %s (a renewal announces nothing)", got, want)
		}
	}
}

// TestConcurrentForceReleases: two force-releases of one key at once end
// its grant once: the second waits for the first, then finds the key free
// (released = false, the counter one above the ended epoch). Kills
// force_release.lock.3 (FOR NO KEY UPDATE -> FOR KEY SHARE: both decide on
// the same row, both report the grant ended, the counter moves by two).
func TestConcurrentForceReleases(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	g := h.grant(t, ctx, "force-k", "o")
	tx := h.begin(t, ctx)
	var released bool
	var epoch int64
	if err := tx.QueryRow(ctx, "SELECT released, epoch FROM lease.force_release('force-k')").Scan(&released, &epoch); err != nil {
		t.Fatal(err)
	}
	if !released || epoch != g.Epoch+1 {
		t.Fatalf("first force_release: %v %d", released, epoch)
	}
	conn, pid := h.backend(t, ctx)
	type res struct {
		released bool
		epoch    int64
		err      error
	}
	done := mustWait(t, h, ctx, pid, false, "the second force_release (for the first)", func() (r res) {
		r.err = conn.QueryRow(ctx, "SELECT released, epoch FROM lease.force_release('force-k')").Scan(&r.released, &r.epoch)
		return r
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.released || r.epoch != g.Epoch+1 {
		t.Fatalf("second force_release after the first committed: released=%v epoch=%d err=%v; want false, %d",
			r.released, r.epoch, r.err, g.Epoch+1)
	}
}

// TestCleanupSkipsLockedRows: lease.cleanup never waits for a row another
// transaction has locked (a fence holds FOR SHARE on its key's row until its
// transaction ends): it removes the other candidates and leaves that one.
// Kills cleanup.lock.1-4 (SKIP LOCKED dropped, NOWAIT, FOR SHARE, no
// locking clause: each waits for, or fails on, the locked row).
func TestCleanupSkipsLockedRows(t *testing.T) {
	h := newHarness(t)
	if !h.hasCleanup(t) {
		return
	}
	ctx := ctxFor(t)
	for _, k := range []string{"skip-locked", "skip-free"} {
		h.cycle(t, ctx, k, 1)
	}
	tx := h.begin(t, ctx)
	// the lock a fence takes, on a free key's row (test setup, as the owner)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM lease.leases WHERE key = 'skip-locked' FOR SHARE"); err != nil {
		t.Fatal(err)
	}
	conn, pid := h.backend(t, ctx)
	type res struct {
		removed int64
		err     error
	}
	done := async(func() (r res) {
		r.err = conn.QueryRow(ctx, "SELECT removed FROM lease.cleanup('0')").Scan(&r.removed)
		return r
	})
	for {
		select {
		case r := <-done:
			if r.err != nil || r.removed != 1 {
				t.Fatalf("cleanup beside a locked row: removed %d, %v; want 1 (the unlocked one)", r.removed, r.err)
			}
			if s, err := h.client.Inspect(ctx, "skip-locked"); err != nil || !s.Exists {
				t.Fatalf("the locked row was removed: %+v %v", s, err)
			}
			if s, err := h.client.Inspect(ctx, "skip-free"); err != nil || s.Exists {
				t.Fatalf("the unlocked free row was kept: %+v %v", s, err)
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
		if h.waiting(t, ctx, pid, false) {
			_ = tx.Rollback(ctx)
			t.Fatalf("cleanup waits for a row another transaction has locked (then: %+v)", <-done)
		}
	}
}

// TestDurabilityForcingIsTransactionLocal: under synchronous_commit = off
// set for the session, a call that changes a lease raises the setting for
// its own transaction only: after the commit the session is back at off.
// (07_durability checks this for acquire.) Kills renew.bool.2
// (set_config(..., true) -> false in renew: the session keeps the forced
// value for good).
func TestDurabilityForcingIsTransactionLocal(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer func() { _, _ = conn.Exec(context.Background(), "RESET synchronous_commit") }()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	var epoch int64
	if err := conn.QueryRow(ctx, "SELECT epoch FROM lease.acquire('dur-k', 'o', '1 hour')").Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	for _, call := range []string{
		"SELECT status FROM lease.renew('dur-k', 'o', $1, '1 hour')",
		"SELECT lease.release('dur-k', 'o', $1)",
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var st, inside string
		if err := tx.QueryRow(ctx, call, epoch).Scan(&st); err != nil || st != "ok" {
			t.Fatalf("%s: %s %v", call, st, err)
		}
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&inside); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var after string
		if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if inside == "off" || after != "off" {
			t.Fatalf("%s under a session's synchronous_commit = off: %q inside its transaction (want raised), %q after it (want off)",
				call, inside, after)
		}
	}
}

// TestConcurrentReleasesOfOneGrant: the holder's release sent twice at once
// (a retry over a second connection) ends the grant once: the second waits
// for the first, then is told not_owner, and the counter is one above the
// ended epoch. Kills release.lock.3 (FOR NO KEY UPDATE -> FOR KEY SHARE:
// the second decides on the row the first is changing, both answer ok, the
// counter moves by two).
func TestConcurrentReleasesOfOneGrant(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	g := h.grant(t, ctx, "rel-k", "o")
	tx := h.begin(t, ctx)
	var st string
	if err := tx.QueryRow(ctx, "SELECT lease.release('rel-k', 'o', $1)", g.Epoch).Scan(&st); err != nil || st != "ok" {
		t.Fatal(st, err)
	}
	conn, pid := h.backend(t, ctx)
	type res struct {
		st  string
		err error
	}
	done := mustWait(t, h, ctx, pid, false, "the second release (for the first)", func() (r res) {
		r.err = conn.QueryRow(ctx, "SELECT lease.release('rel-k', 'o', $1)", g.Epoch).Scan(&r.st)
		return r
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.st != "not_owner" {
		t.Fatalf("second release after the first committed: %q %v, want not_owner", r.st, r.err)
	}
	if s, err := h.client.Inspect(ctx, "rel-k"); err != nil || s.Held || s.Epoch != g.Epoch+1 {
		t.Fatalf("after both releases: %+v %v, want free with counter %d", s, err, g.Epoch+1)
	}
}

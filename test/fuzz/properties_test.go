package fuzz

// Properties that the mutation pass (hack/mutate.py, docs/defects.md) found
// no suite checking: each test here kills the mutants named in its comment.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestNotifySwitchValues: every spelling of "off" that lease._changed
// documents (off, false, no, 0, f, n, any case) turns notifications off for
// the session; anything else leaves them on. Kills _changed.inlist.* (one
// value dropped from the list).
func TestNotifySwitchValues(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	listener, err := pgx.Connect(ctx, h.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(ctx, "LISTEN pg_lease"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, h.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
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
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		i := strings.Index(n.Payload, `"key" : "`)
		if i < 0 {
			t.Fatalf("payload %q", n.Payload)
		}
		rest := n.Payload[i+len(`"key" : "`):]
		return rest[:strings.IndexByte(rest, '"')]
	}
	for i, v := range []string{"off", "false", "no", "0", "f", "n", "OFF", "False", "NO", "F", "N"} {
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
	for _, v := range []string{"on", "true", "yes", "1", "", "offf"} {
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
  SELECT * INTO r FROM lease.acquire('`+key+`', 'o', '1 hour', v_wait);
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

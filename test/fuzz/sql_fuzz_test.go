package fuzz

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Functions of FuzzSQL (fn % numFns).
const (
	fnAcquire       = iota
	fnAcquireNoWait // the three-argument call (wait's DEFAULT)
	fnRenew
	fnRelease
	fnFence
	fnInspect
	fnForceRelease
	fnCleanup
	fnList
	fnVersion
	numFns
)

var fnNames = [numFns]string{"acquire", "acquire/3", "renew", "release", "fence", "inspect", "force_release",
	"cleanup", "list", "version"}

// NULL bits of FuzzSQL's nulls argument.
const (
	nullKey = 1 << iota
	nullOwner
	nullEpoch
	nullTTL
	nullWait
	nullMaxRows
)

// FuzzSQL calls the lease.* functions with raw pgx: typed parameters
// ($1::text, $3::bigint, $4::interval ...), typed NULLs (nulls bits), and
// intervals as any text PostgreSQL parses as one ('10000 years',
// '-1 day 86400 s', '178000000 years', '1 mon -30 days' ...). ttl is also
// cleanup's free_for. pre is the key's starting state as in FuzzClient
// (taken through pkg/lease when key and owner are valid).
func FuzzSQL(f *testing.F) {
	for _, s := range []struct {
		fn, nulls, pre uint8
		key, owner     string
		epoch          int64
		ttl, wait      string
		maxRows        int32
	}{
		{fnAcquire, 0, preNone, "k", "o", 0, "1s", "0", 0},
		{fnAcquire, nullKey | nullOwner | nullTTL | nullWait, preNone, "k", "o", 0, "1s", "0", 0},
		{fnAcquire, nullWait, preNone, "k", "o", 0, "1s", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "-1 day 86400 s", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "1 day -86400 s", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "1 mon -30 days 0.000001 s", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "0.000001 s", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "292000 years", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "291000 years", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "178000000 years", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "-178000000 years", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "2147483647 days 2562047788 hours", "0", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "1s", "292000 years", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "1s", "-0.000001 s", 0},
		{fnAcquire, 0, preNone, "k", "o", 0, "1s", "0.01 s", 0},
		{fnAcquire, 0, preHeld, "k", "o", 0, "1h", "1 day", 0},
		{fnAcquire, 0, preOther, "k", "o", 0, "1h", "0", 0},
		{fnAcquireNoWait, 0, preLapsed, "k", "o", 0, "1h", "0", 0},
		{fnAcquireNoWait, nullTTL, preNone, "k", "o", 0, "1h", "0", 0},
		{fnRenew, 0, preHeld, "k", "o", 0, "1h", "", 0},
		{fnRenew, nullEpoch, preHeld, "k", "o", 0, "1h", "", 0},
		{fnRenew, 0, preHeld, "k", "o", -9223372036854775808, "1h", "", 0},
		{fnRenew, 0, preHeld, "k", "o", 9223372036854775807, "1h", "", 0},
		{fnRenew, 0, preLapsed, "k", "o", 0, "1h", "", 0},
		{fnRenew, 0, preHeld, "k", "o", 0, "291000 years", "", 0},
		{fnRelease, 0, preHeld, "k", "o", 0, "", "", 0},
		{fnRelease, nullKey | nullOwner | nullEpoch, preNone, "k", "o", 0, "", "", 0},
		{fnRelease, 0, preOther, "k", "o", 0, "", "", 0},
		{fnFence, 0, preHeld, "k", "o", 0, "", "", 0},
		{fnFence, 0, preLapsed, "k", "o", 0, "", "", 0},
		{fnFence, nullEpoch, preHeld, "k", "o", 0, "", "", 0},
		{fnInspect, 0, preHeld, "k", "", 0, "", "", 0},
		{fnInspect, nullKey, preNone, "k", "", 0, "", "", 0},
		{fnForceRelease, 0, preOther, "k", "", 0, "", "", 0},
		{fnForceRelease, nullKey, preNone, "k", "", 0, "", "", 0},
		{fnCleanup, 0, preFree, "k", "o", 0, "0", "", 1},
		{fnCleanup, 0, preFree, "k", "o", 0, "0", "", 0},
		{fnCleanup, 0, preFree, "k", "o", 0, "0", "", -2147483648},
		{fnCleanup, nullTTL | nullMaxRows, preNone, "k", "o", 0, "0", "", 1},
		{fnCleanup, 0, preNone, "k", "o", 0, "10000 years", "", 10},
		{fnCleanup, 0, preNone, "k", "o", 0, "291000 years", "", 10},
		{fnCleanup, 0, preNone, "k", "o", 0, "-1 s", "", 10},
		{fnList, 0, preHeld, "k", "o", 0, "", "", 0},
		{fnVersion, 0, preNone, "k", "o", 0, "", "", 0},
	} {
		f.Add(s.fn, s.nulls, s.pre, s.key, s.owner, s.epoch, s.ttl, s.wait, s.maxRows)
	}
	h := newHarness(f)
	f.Fuzz(func(t *testing.T, fn, nulls, pre uint8, key, owner string, epoch int64, ttl, wait string, maxRows int32) {
		h.fuzzSQL(t, fn%numFns, nulls, pre%numPre, key, owner, epoch, ttl, wait, maxRows)
	})
}

// parseInterval asks the server what the text means as an interval, and the
// headroom to timestamptz's bounds now. ok is false when it is no interval
// at all (the input is then not one pg_lease can be given).
func (h *harness) parseInterval(t *testing.T, s string, null bool) (interval, bool) {
	if null {
		return interval{null: true}, true
	}
	if !representable(s) {
		return interval{}, false
	}
	v := interval{fromText: s}
	err := h.pool.QueryRow(ctxFor(t), `SELECT isfinite(v), extract(epoch FROM v)::float8,
		  extract(epoch FROM timestamptz '294276-12-31 23:59:59+00') - extract(epoch FROM clock_timestamp()) - 1,
		  extract(epoch FROM clock_timestamp()) - extract(epoch FROM timestamptz '4714-11-24 00:00:00+00 BC')
		FROM (SELECT $1::text::interval AS v) s`, s).Scan(&v.finite, &v.secs, &v.upper, &v.lower)
	if err != nil {
		if pgErr(err) != nil {
			return interval{}, false
		}
		t.Fatal(err)
	}
	return v, true
}

func (h *harness) fuzzSQL(t *testing.T, fn, nulls, pre uint8, key, owner string, epoch int64, ttlText, waitText string, maxRows int32) {
	ctx := ctxFor(t)
	r := h.rules
	if fn == fnCleanup && !r.hasCleanup {
		fn = fnList
	}
	takesKey := fn <= fnForceRelease
	takesOwner := fn <= fnFence
	takesEpoch := fn == fnRenew || fn == fnRelease || fn == fnFence
	takesTTL := fn == fnAcquire || fn == fnAcquireNoWait || fn == fnRenew || fn == fnCleanup
	takesWait := fn == fnAcquire

	// Texts the server cannot receive, and intervals that do not parse, are
	// no input of pg_lease's (pgx or the cast refuses them first).
	if (takesKey && nulls&nullKey == 0 && !representable(key)) ||
		(takesOwner && nulls&nullOwner == 0 && !representable(owner)) {
		return
	}
	var ttl, wait interval
	var ok bool
	if takesTTL {
		if ttl, ok = h.parseInterval(t, ttlText, nulls&nullTTL != 0); !ok {
			return
		}
	}
	if takesWait {
		if wait, ok = h.parseInterval(t, waitText, nulls&nullWait != 0); !ok {
			return
		}
	}
	pk, po, pe := &key, &owner, &epoch
	if nulls&nullKey != 0 {
		pk = nil
	}
	if nulls&nullOwner != 0 {
		po = nil
	}
	if nulls&nullEpoch != 0 {
		pe = nil
	}
	var pm *int32
	if nulls&nullMaxRows == 0 {
		pm = &maxRows
	}

	// The expectation (argument order, as the DETAIL lists them).
	var vs violations
	if takesKey {
		vs.text(r, "key", pk)
	}
	if takesOwner {
		vs.text(r, "owner", po)
	}
	if takesEpoch {
		vs.epoch(r, pe)
	}
	switch {
	case fn == fnCleanup:
		vs.duration(r, "free_for", ttl, false)
		if r.freeForLowerBound && !ttl.null && ttl.finite {
			vs.add("free_for", "free_for is too large (lower bound)", bound(ttl.secs-ttl.lower))
		}
		if pm == nil {
			vs.add("max_rows", "max_rows must not be NULL", invalid)
		} else if *pm < 1 {
			vs.add("max_rows", "max_rows must be at least 1", invalid)
		}
	case takesTTL:
		vs.duration(r, "ttl", ttl, true)
	}
	if takesWait {
		vs.duration(r, "wait", wait, false)
		if r.ttlPlusWait && vs.verdict == valid && !ttl.null && !wait.null {
			vs.add("ttl", "ttl + wait would overflow", bound(ttl.secs+wait.secs-ttl.upper))
		}
	}

	// The starting state, through pkg/lease (only for a valid key and owner).
	if vs.verdict != valid || !takesOwner && fn != fnInspect && fn != fnForceRelease && fn != fnCleanup && fn != fnList {
		pre = preNone
	}
	if !takesOwner && (!representable(owner) || r.textViolation("owner", &owner) != "") {
		owner = "fuzz-owner" // not an argument: only the holder of the starting state
	}
	if pk == nil || !representable(key) || r.textViolation("key", pk) != "" || r.textViolation("owner", &owner) != "" || !representable(owner) {
		pre = preNone
	}
	if fn == fnAcquire && pre == preOther && !wait.null && wait.secs > 0.02 {
		pre = preNone // a blocking acquire of a held key would wait for its whole wait
	}
	if pk != nil {
		h.reset(t, key)
	}
	var cur int64
	other := "fuzz-other"
	if owner == other {
		other = "fuzz-other-2"
	}
	if pre != preNone {
		holder, d := owner, time.Hour
		if pre == preOther {
			holder = other
		}
		if pre == preLapsed {
			d = time.Microsecond
		}
		g, ok, err := h.client.Acquire(ctx, key, holder, d)
		switch {
		case err != nil && r.payloadOverflow && isPayloadOverflow(err):
			pre = preNone
		case err != nil || !ok:
			t.Fatalf("setup: %v %v", ok, err)
		default:
			cur = g.Epoch
			if pre == preFree {
				if err := h.client.Release(ctx, g.Token); err != nil {
					t.Fatalf("setup: release: %v", err)
				}
				cur++
			}
			if pre == preLapsed {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	if takesEpoch && pe != nil && pre != preNone {
		// A fuzzed epoch is mostly far from the key's: aim near it sometimes.
		if epoch >= -2 && epoch <= 2 {
			epoch += cur
		}
	}
	t.Logf("lease.%s from %q: key %v owner %v epoch %v ttl %q wait %q max_rows %v nulls %06b",
		fnNames[fn], preNames[pre], show(pk), show(po), showInt(pe), ttlText, waitText, showInt(pm), nulls)

	before := h.snapshot(t)
	var query string
	args := []any{}
	switch fn {
	case fnAcquire:
		query, args = `SELECT a.acquired::text, a.epoch::text FROM lease.acquire($1::text, $2::text, $3::text::interval, $4::text::interval) a`,
			[]any{pk, po, ival(ttl), ival(wait)}
	case fnAcquireNoWait:
		query, args = `SELECT a.acquired::text, a.epoch::text FROM lease.acquire($1::text, $2::text, $3::text::interval) a`,
			[]any{pk, po, ival(ttl)}
	case fnRenew:
		query, args = `SELECT r.status, r.expires_at::text FROM lease.renew($1::text, $2::text, $3::bigint, $4::text::interval) r`,
			[]any{pk, po, pe, ival(ttl)}
	case fnRelease:
		query, args = `SELECT lease.release($1::text, $2::text, $3::bigint), ''`, []any{pk, po, pe}
	case fnFence:
		query, args = `SELECT lease.fence($1::text, $2::text, $3::bigint)::text, ''`, []any{pk, po, pe}
	case fnInspect:
		query, args = `SELECT coalesce(string_agg(i::text, ';'), 'none'), '' FROM lease.inspect($1::text) i`, []any{pk}
	case fnForceRelease:
		query, args = `SELECT f.released::text, coalesce(f.epoch::text, 'null') FROM lease.force_release($1::text) f`, []any{pk}
	case fnCleanup:
		query, args = `SELECT c.removed::text, c.epoch_floor::text FROM lease.cleanup($1::text::interval, $2::integer) c`,
			[]any{ival(ttl), pm}
	case fnList:
		query = `SELECT count(*)::text, coalesce(string_agg(l.key, ',' ORDER BY l.key) FILTER (WHERE l.key = 'k'), '') FROM lease.list() l`
	case fnVersion:
		query = `SELECT lease.version(), ''`
	}
	var a, b *string
	var err error
	if fn == fnFence {
		var tx pgx.Tx
		if tx, err = h.pool.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		err = tx.QueryRow(ctx, query, args...).Scan(&a, &b)
		if rerr := tx.Rollback(ctx); rerr != nil {
			t.Fatal(rerr)
		}
	} else {
		err = h.pool.QueryRow(ctx, query, args...).Scan(&a, &b)
	}

	if vs.verdict == invalid {
		checkInvalid(t, err, vs.names, false, false)
		h.unchanged(t, before, "an invalid call")
		return
	}
	if err != nil {
		pg := pgErr(err)
		switch {
		case vs.verdict == either && pg != nil && pg.Code == "22023" && pg.Message == "invalid_input":
			// at a bound: refused is right too
		case r.payloadOverflow && isPayloadOverflow(err):
			// known deviation before 0.3.0; a long key or owner
			if payloadVerdict(payloadLen("force_released", key, owner, cur+1)) == valid &&
				payloadVerdict(payloadLen("force_released", key, other, cur+1)) == valid {
				t.Fatalf("payload string too long for a short key and owner: %v", err)
			}
		case fn == fnCleanup && r.cleanupUnderflow && pg != nil && pg.Code == "22008" && ttl.secs >= ttl.lower-fuzzy:
			// known deviation before 0.3.0: free_for past 4714 BC
		case fn == fnFence && pg != nil && pg.Code == "55000" &&
			(pg.Message == "not_owner" || pg.Message == "lapsed" || pg.Message == "epoch_mismatch"):
			if pre == preHeld && pe != nil && *pe == cur {
				t.Fatalf("fence of the current grant: %v", err)
			}
		case fn == fnAcquire && pg != nil && pg.Code == "57014" && pg.Message == "timeout" && pre == preOther:
		default:
			t.Fatalf("lease.%s: %v (SQLSTATE %s), want a result or 22023 invalid_input", fnNames[fn], err, code(err))
		}
		h.unchanged(t, before, "a failed call")
		return
	}
	// Results consistent with the starting state.
	res := fmt.Sprintf("%s %s", show(a), show(b))
	switch fn {
	case fnAcquire, fnAcquireNoWait:
		if want := pre != preOther; (*a == "true") != want {
			t.Fatalf("acquire from %s: %s", preNames[pre], res)
		}
		if *a == "false" {
			h.unchanged(t, before, "a denied acquire")
		}
	case fnRenew, fnRelease:
		want := "not_owner"
		switch {
		case pre == preHeld && *pe == cur:
			want = "ok"
		case pre == preHeld:
			want = "epoch_mismatch"
		case pre == preLapsed:
			want = "lapsed"
		}
		if *a != want {
			t.Fatalf("%s from %s (epoch %d, current %d): %s, want %s", fnNames[fn], preNames[pre], *pe, cur, res, want)
		}
		if want != "ok" {
			h.unchanged(t, before, "a failed "+fnNames[fn])
		}
	case fnFence:
		if pre != preHeld || *pe != cur {
			t.Fatalf("fence from %s (epoch %d, current %d) succeeded: %s", preNames[pre], *pe, cur, res)
		}
		h.unchanged(t, before, "a fence (rolled back)")
	case fnInspect, fnList, fnVersion:
		if fn == fnInspect && (*a == "none") != (pre == preNone) {
			t.Fatalf("inspect from %s: %s", preNames[pre], res)
		}
		h.unchanged(t, before, "lease."+fnNames[fn])
	case fnForceRelease:
		if want := pre == preHeld || pre == preOther || pre == preLapsed; (*a == "true") != want {
			t.Fatalf("force_release from %s: %s", preNames[pre], res)
		}
		if *a == "false" {
			h.unchanged(t, before, "a force_release that released nothing")
		}
	}
}

func ival(v interval) any {
	if v.null {
		return nil
	}
	return v.fromText
}

func show(s *string) string {
	if s == nil {
		return "NULL"
	}
	if len(*s) > 80 {
		return fmt.Sprintf("%q...(%d bytes)", (*s)[:80], len(*s))
	}
	return fmt.Sprintf("%q", *s)
}

func showInt[T int32 | int64](p *T) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

func code(err error) string {
	if pg := pgErr(err); pg != nil {
		return pg.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "none"
}

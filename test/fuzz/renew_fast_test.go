package fuzz

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// TestRenewFastPathIsASubset: lease.renew skips its full input checks
// (lease._renew_violations) when the fast test lease._renew_fast says true.
// Over many generated arguments and max_ttl settings (configured ones, and
// ones written straight into lease.settings beyond what lease.configure
// allows), this checks two properties, the answers compared row by row:
//
//   - subset: the fast test never accepts what the full checks reject, so
//     renew's answers (22023 and its DETAIL) are those of the full checks;
//   - reach: for every ttl of at most 100 years, the fast test accepts
//     exactly what the full checks accept, so every valid renewal takes the
//     fast path (a stricter fast test would cost time and change no answer).
//
// The inputs mix the edges of each rule (NULL, empty, 1024/1025 bytes in
// one- and two-byte characters, each control character's neighbours, epochs
// 0 and 1, ttls a microsecond either side of 0, of max_ttl and of 100
// years, months counted as 30 days, the overflow bound) with random ones.
func TestRenewFastPathIsASubset(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	var has bool
	if err := h.pool.QueryRow(ctx, "SELECT to_regprocedure('lease._renew_fast(text,text,bigint,interval,interval)') IS NOT NULL").Scan(&has); err != nil {
		t.Fatal(err)
	}
	if !has {
		if h.version >= "0.4.0" {
			t.Fatalf("pg_lease %s without lease._renew_fast", h.version)
		}
		t.Logf("pg_lease %s has no validation fast path: the property does not apply", h.version)
		return
	}
	conn := h.connect(t, ctx)
	defer conn.Exec(ctx, "DELETE FROM lease.settings")

	rng := rand.New(rand.NewSource(1))
	texts := []*string{nil, ptr(""), ptr("k"), ptr("a b"), ptr(strings.Repeat("a", 1024)), ptr(strings.Repeat("a", 1025)),
		ptr(strings.Repeat("é", 512)), ptr(strings.Repeat("é", 513)), ptr(strings.Repeat("a", 1023) + "é"),
		ptr("k\x01"), ptr("\x1fk"), ptr("k\x1f"), ptr("k\x7f"), ptr("k\x20"), ptr("k\x7e"), ptr("k\t"), ptr("k\n"),
		ptr("k\u0080"), ptr("ключ"), ptr("k\\x01"), ptr("[\x01-\x1f]")}
	epochs := []*int64{nil, ptr(int64(math.MinInt64)), ptr(int64(-1)), ptr(int64(0)), ptr(int64(1)), ptr(int64(2)),
		ptr(int64(1) << 40), ptr(int64(math.MaxInt64))}
	ttls := []*string{nil, ptr("0"), ptr("1 microsecond"), ptr("-1 microsecond"), ptr("-5 s"), ptr("0.5 s"), ptr("1 s"),
		ptr("1 s 1 microsecond"), ptr("59 min 59.999999 s"), ptr("1 h"), ptr("1 h 1 microsecond"), ptr("1 day"),
		ptr("30 days"), ptr("30 days 1 microsecond"), ptr("1 mon"), ptr("1 mon -30 days"), ptr("1 mon -29 days"),
		ptr("-1 mon 31 days"), ptr("1 day -86399 s"), ptr("1 day -86400 s"), ptr("1 year"), ptr("1 year -1 microsecond"),
		ptr("99 years 12 mons"), ptr("100 years"), ptr("100 years 1 microsecond"), ptr("100 years -1 microsecond"),
		ptr("1199 mons 30 days"), ptr("150 years"), ptr("200 years"), ptr("200000 years"), ptr("290000 years"),
		ptr("292000 years"), ptr("-100 years"), ptr("178000000 years")}
	// Settings: no row (the default, 1 hour), configured values, and raw
	// rows lease.configure refuses (above 100 years, in months).
	settings := []struct{ what, sql string }{
		{"no settings row", "DELETE FROM lease.settings"},
		{"configure 1 hour", "SELECT lease.configure(max_ttl => '1 hour')"},
		{"configure 1 s", "SELECT lease.configure(max_ttl => '1 s')"},
		{"configure 30 days", "SELECT lease.configure(max_ttl => '30 days')"},
		{"configure 1 year", "SELECT lease.configure(max_ttl => '1 year')"},
		{"configure 100 years", "SELECT lease.configure(max_ttl => '100 years')"},
		{"raw 1 mon", "UPDATE lease.settings SET max_ttl = '1 mon'"},
		{"raw 200 years", "UPDATE lease.settings SET max_ttl = '200 years'"},
		{"raw 300000 years", "UPDATE lease.settings SET max_ttl = '300000 years'"},
	}
	randText := func() *string {
		if rng.Intn(3) == 0 {
			return texts[rng.Intn(len(texts))]
		}
		alphabet := []rune{'a', 'é', ' ', '\x01', '\x1f', '\x20', '\x7f', '\x7e', 'ж', '\\', '['}
		n := rng.Intn(8)
		if rng.Intn(4) == 0 {
			n = 1015 + rng.Intn(15) // around the bound, in bytes or characters
		}
		var b strings.Builder
		for i := 0; i < n; i++ {
			if rng.Intn(50) == 0 {
				b.WriteRune(alphabet[rng.Intn(len(alphabet))])
			} else {
				b.WriteByte('a')
			}
		}
		return ptr(b.String())
	}
	randTTL := func() *string {
		if rng.Intn(2) == 0 {
			return ttls[rng.Intn(len(ttls))]
		}
		// months, days and microseconds of either sign, mostly small
		mons := rng.Intn(25) - 12
		if rng.Intn(8) == 0 {
			mons = rng.Intn(2600) - 1300
		}
		days := rng.Intn(61) - 30
		us := rng.Int63n(2*3600e6) - 3600e6
		return ptr(fmt.Sprintf("%d mons %d days %d microseconds", mons, days, us))
	}

	type input struct {
		k, o *string
		e    *int64
		t    *string
	}
	var inputs []input
	for _, tt := range ttls { // every ttl edge with valid, then each invalid, text and epoch
		inputs = append(inputs, input{ptr("k"), ptr("o"), ptr(int64(1)), tt})
		for _, x := range texts {
			inputs = append(inputs, input{x, ptr("o"), ptr(int64(1)), tt}, input{ptr("k"), x, ptr(int64(1)), tt})
		}
		for _, e := range epochs {
			inputs = append(inputs, input{ptr("k"), ptr("o"), e, tt})
		}
	}
	for i := 0; i < 3000; i++ {
		inputs = append(inputs, input{randText(), randText(), epochs[rng.Intn(len(epochs))], randTTL()})
	}
	ks := make([]*string, len(inputs))
	owners := make([]*string, len(inputs))
	es := make([]*int64, len(inputs))
	ts := make([]*string, len(inputs))
	for i, in := range inputs {
		ks[i], owners[i], es[i], ts[i] = in.k, in.o, in.e, in.t
	}

	const q = `SELECT u.i, coalesce(lease._renew_fast(u.k, u.o, u.e, u.t::interval, (SELECT s.max_ttl FROM lease.settings s)), false),
	       cardinality(array_remove(lease._renew_violations(u.k, u.o, u.e, u.t::interval), NULL)) = 0,
	       u.t IS NULL OR extract(epoch FROM u.t::interval) <= extract(epoch FROM interval '100 years')
	  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY u(k, o, e, t, i)`
	show := func(in input) string {
		s := func(p *string) string {
			if p == nil {
				return "NULL"
			}
			if len(*p) > 40 {
				return fmt.Sprintf("%q…(%d bytes)", (*p)[:40], len(*p))
			}
			return fmt.Sprintf("%q", *p)
		}
		e := "NULL"
		if in.e != nil {
			e = fmt.Sprint(*in.e)
		}
		return fmt.Sprintf("key %s owner %s epoch %s ttl %s", s(in.k), s(in.o), e, s(in.t))
	}
	for _, st := range settings {
		if _, err := conn.Exec(ctx, st.sql); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		rows, err := conn.Query(ctx, q, ks, owners, es, ts)
		if err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		var n, fastN, fullN, bad int
		for rows.Next() {
			var i int64
			var fast, full, inRange bool
			if err := rows.Scan(&i, &fast, &full, &inRange); err != nil {
				t.Fatal(err)
			}
			n++
			if fast {
				fastN++
			}
			if full {
				fullN++
			}
			in := inputs[i-1]
			switch {
			case fast && !full:
				bad++
				t.Errorf("%s: the fast path accepts what the full checks reject: %s", st.what, show(in))
			case inRange && full && !fast:
				bad++
				t.Errorf("%s: a valid renewal with ttl <= 100 years misses the fast path: %s", st.what, show(in))
			}
			if bad > 20 {
				rows.Close()
				t.Fatalf("%s: more than 20 disagreements", st.what)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if n != len(inputs) {
			t.Fatalf("%s: %d rows for %d inputs", st.what, n, len(inputs))
		}
		// Both sides of the rules were reached under every setting.
		if fastN == 0 || fullN == n {
			t.Fatalf("%s: %d of %d inputs took the fast path and %d passed the full checks: the inputs miss a side", st.what, fastN, n, fullN)
		}
		t.Logf("%s: %d inputs, %d valid, %d on the fast path", st.what, n, fullN, fastN)
	}
}

func ptr[T any](v T) *T { return &v }

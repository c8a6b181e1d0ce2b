package hostile

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// rateWindow is the window over which a party's statements are counted.
const rateWindow = 2 * time.Second

// maxPerKind bounds how many violations of one kind on one key (or party)
// the after-run checks list; the rest are counted.
const maxPerKind = 5

// RateViolations is check (3): in no window of rateWindow did an honest party
// send more statements than its limit allows. The worst window of each
// offending party is reported.
func RateViolations(calls []Calls) []Violation {
	var out []Violation
	for _, c := range calls {
		at := append([]time.Duration(nil), c.At...)
		sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
		allowed := int(c.Limit * rateWindow.Seconds())
		best, bestAt := 0, time.Duration(0)
		j := 0
		for i := range at {
			for j < len(at) && at[j]-at[i] < rateWindow {
				j++
			}
			if n := j - i; n > best {
				best, bestAt = n, at[i]
			}
		}
		if best > allowed {
			out = append(out, Violation{Check: CheckRate, At: bestAt, What: fmt.Sprintf(
				"%s sent %d statements in %v from %.3fs (%.0f/s; its cadence allows %.0f/s at 10x)",
				c.Party, best, rateWindow, bestAt.Seconds(), float64(best)/rateWindow.Seconds(), c.Limit)})
		}
	}
	return out
}

// EpochViolations is check (5). Within one party's observations of one source
// (ordered), a key's epoch never goes down. Across parties, an observation
// whose read was sent after another observation was received never shows a
// lower epoch of the same key.
func EpochViolations(obs []Obs) []Violation {
	var out []Violation
	// One party, one source, one key.
	seqs := map[string][]Obs{}
	for _, o := range obs {
		id := o.Party + "\x00" + o.Source + "\x00" + o.Key
		seqs[id] = append(seqs[id], o)
	}
	ids := make([]string, 0, len(seqs))
	for id := range seqs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := seqs[id]
		sort.Slice(s, func(i, j int) bool { return s[i].Seq < s[j].Seq })
		var top Obs
		n := 0
		for _, o := range s {
			if o.Epoch < top.Epoch {
				if n < maxPerKind {
					out = append(out, Violation{Check: CheckEpochs, At: o.Recv, What: fmt.Sprintf(
						"%s saw %s at epoch %d (%s, %.3fs) after epoch %d (%.3fs)",
						o.Party, o.Key, o.Epoch, o.Source, o.Recv.Seconds(), top.Epoch, top.Recv.Seconds())})
				}
				n++
				continue
			}
			top = o
		}
		if n > maxPerKind {
			out = append(out, Violation{Check: CheckEpochs, What: fmt.Sprintf("... and %d more epochs going down in %s",
				n-maxPerKind, strings.ReplaceAll(id, "\x00", " "))})
		}
	}
	// Across parties: an observation received before another read was sent
	// bounds that read from below.
	byKey := map[string][]Obs{}
	for _, o := range obs {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		all := byKey[k]
		byRecv := append([]Obs(nil), all...)
		sort.Slice(byRecv, func(i, j int) bool { return byRecv[i].Recv < byRecv[j].Recv })
		var reads []Obs
		for _, o := range all {
			if o.Sent >= 0 {
				reads = append(reads, o)
			}
		}
		sort.Slice(reads, func(i, j int) bool { return reads[i].Sent < reads[j].Sent })
		var top Obs
		i, n := 0, 0
		for _, b := range reads {
			for i < len(byRecv) && byRecv[i].Recv < b.Sent {
				if byRecv[i].Epoch > top.Epoch {
					top = byRecv[i]
				}
				i++
			}
			if b.Epoch < top.Epoch {
				if n < maxPerKind {
					out = append(out, Violation{Check: CheckEpochs, At: b.Sent, What: fmt.Sprintf(
						"%s read %s at epoch %d (%s, sent %.3fs) after %s had seen epoch %d (%s, %.3fs)",
						b.Party, k, b.Epoch, b.Source, b.Sent.Seconds(), top.Party, top.Epoch, top.Source, top.Recv.Seconds())})
				}
				n++
			}
		}
		if n > maxPerKind {
			out = append(out, Violation{Check: CheckEpochs, What: fmt.Sprintf("... and %d more reads of %s below an epoch seen before", n-maxPerKind, k)})
		}
	}
	return out
}

// OverlapViolations is check (6): no two believed terms of one key overlap,
// and no epoch is believed by two parties.
func OverlapViolations(terms []Term) []Violation {
	var out []Violation
	byKey := map[string][]Term{}
	for _, t := range terms {
		byKey[t.Key] = append(byKey[t.Key], t)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ts := byKey[k]
		sort.Slice(ts, func(i, j int) bool { return ts[i].Start < ts[j].Start })
		n := 0
		add := func(v Violation) {
			if n < maxPerKind {
				out = append(out, v)
			}
			n++
		}
		owner := map[int64]Term{}
		for i, a := range ts {
			if b, ok := owner[a.Epoch]; ok && b.Party != a.Party {
				add(Violation{Check: CheckOverlap, At: a.Start, What: fmt.Sprintf(
					"%s: epoch %d believed by %s (%s, from %.3fs) and by %s (%s, from %.3fs)",
					k, a.Epoch, b.Party, b.Role, b.Start.Seconds(), a.Party, a.Role, a.Start.Seconds())})
			}
			owner[a.Epoch] = a
			if a.End <= a.Start {
				continue
			}
			for _, b := range ts[i+1:] {
				if b.Start >= a.End {
					break
				}
				if b.End <= b.Start || b.Party == a.Party && b.Epoch == a.Epoch {
					continue
				}
				add(Violation{Check: CheckOverlap, At: b.Start, What: fmt.Sprintf(
					"%s: %s (%s) believed epoch %d over [%.3fs, %.3fs] and %s (%s) epoch %d over [%.3fs, %.3fs]",
					k, a.Party, a.Role, a.Epoch, a.Start.Seconds(), a.End.Seconds(),
					b.Party, b.Role, b.Epoch, b.Start.Seconds(), b.End.Seconds())})
			}
		}
		if n > maxPerKind {
			out = append(out, Violation{Check: CheckOverlap, What: fmt.Sprintf("... and %d more overlaps on %s", n-maxPerKind, k)})
		}
	}
	return out
}

// Result is a run's outcome.
type Result struct {
	Seed       int64
	Duration   time.Duration
	Violations []Violation
	Stats      map[string]int
	Terms      int
	Obs        int
	// Calls is each honest party's statement count and limit.
	Calls []Calls
}

// Check runs the after-run checks over d and returns every violation, the
// ones found during the run first.
func Check(seed int64, dur time.Duration, d Data) *Result {
	res := &Result{Seed: seed, Duration: dur, Stats: d.Stats, Terms: len(d.Terms), Obs: len(d.Obs), Calls: d.Calls}
	res.Violations = append(res.Violations, d.Violations...)
	res.Violations = append(res.Violations, RateViolations(d.Calls)...)
	res.Violations = append(res.Violations, EpochViolations(d.Obs)...)
	res.Violations = append(res.Violations, OverlapViolations(d.Terms)...)
	return res
}

// ByCheck counts the violations of each check.
func (r *Result) ByCheck() map[string]int {
	m := map[string]int{}
	for _, v := range r.Violations {
		m[v.Check]++
	}
	return m
}

// Report writes the summary and at most perCheck violations of each check,
// each line with the seed.
func (r *Result) Report(w io.Writer, perCheck int) {
	fmt.Fprintf(w, "hostile tenants: seed %d, %v; %d believed terms, %d epoch observations\n", r.Seed, r.Duration, r.Terms, r.Obs)
	stats := make([]string, 0, len(r.Stats))
	for k := range r.Stats {
		stats = append(stats, k)
	}
	sort.Strings(stats)
	for _, k := range stats {
		fmt.Fprintf(w, "  %-40s %d\n", k, r.Stats[k])
	}
	for _, c := range r.Calls {
		fmt.Fprintf(w, "  calls %-34s %d (limit %.0f/s)\n", c.Party, len(c.At), c.Limit)
	}
	by := r.ByCheck()
	for _, ch := range AllChecks {
		status := "ok"
		if by[ch] > 0 {
			status = fmt.Sprintf("FAILED (%d)", by[ch])
		}
		fmt.Fprintf(w, "check %-11s %s\n", ch, status)
	}
	shown := map[string]int{}
	for _, v := range r.Violations {
		if shown[v.Check]++; shown[v.Check] > perCheck {
			continue
		}
		fmt.Fprintf(w, "seed %d: %s\n", r.Seed, v)
	}
	for _, ch := range AllChecks {
		if n := shown[ch] - perCheck; n > 0 {
			fmt.Fprintf(w, "seed %d: [%s] ... and %d more\n", r.Seed, ch, n)
		}
	}
}

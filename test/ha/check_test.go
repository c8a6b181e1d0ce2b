package ha

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pglease/pg_lease/internal/patroni"
)

// check verifies the whole run of a mode (every candidate stopped):
//
//   - one leader at a time: per key, no two terms of different owners or
//     epochs overlap on this process's monotonic clock;
//   - no (key, epoch) granted twice, and epochs strictly increasing per key
//     in the order the terms began;
//   - the guard outside the cluster accepted, per key, epochs that never go
//     back, each from one owner;
//   - the writes that fence.InTx committed in the cluster and that the
//     final primary has carry, per (key, epoch), one owner;
//   - in the synchronous modes, every acknowledged fenced write is on the
//     final primary, and every pkg/lease call the ledger saw acknowledged
//     survived each failover.
func (w *world) check(ctx context.Context) {
	t := w.t
	var v []string
	terms := w.allTerms()
	sort.Slice(terms, func(i, j int) bool { return terms[i].start.Before(terms[j].start) })
	byKey := map[string][]term{}
	for _, tr := range terms {
		byKey[tr.key] = append(byKey[tr.key], tr)
	}
	for _, k := range w.keys {
		ts := byKey[k]
		if len(ts) == 0 {
			v = append(v, fmt.Sprintf("key %s: no term at all", k))
		}
		owner := map[int64]string{}
		for i, a := range ts {
			if o, ok := owner[a.epoch]; ok && o != a.who {
				v = append(v, fmt.Sprintf("key %s: epoch %d granted to %s and %s", k, a.epoch, o, a.who))
			}
			owner[a.epoch] = a.who
			if i > 0 && a.epoch <= ts[i-1].epoch {
				v = append(v, fmt.Sprintf("key %s: %s's term (epoch %d) began after %s's (epoch %d)", k, a.who, a.epoch, ts[i-1].who, ts[i-1].epoch))
			}
			for _, b := range ts[i+1:] {
				if a.fromEvents || b.fromEvents {
					continue
				}
				if a.end.IsZero() || b.start.Before(a.end) {
					v = append(v, fmt.Sprintf("key %s: %s (epoch %d) led until %v after %s (epoch %d) began",
						k, a.who, a.epoch, a.end.Sub(b.start).Round(time.Millisecond), b.who, b.epoch))
				}
			}
		}
	}

	// The guard outside the cluster, in commit order.
	rows, err := w.gpool.Query(ctx, `SELECT key, owner, epoch FROM guard_writes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	highest := map[string]int64{}
	gOwner := map[string]string{}
	var accepted int
	for rows.Next() {
		var k, o string
		var e int64
		if err := rows.Scan(&k, &o, &e); err != nil {
			t.Fatal(err)
		}
		accepted++
		if e < highest[k] {
			v = append(v, fmt.Sprintf("guard: key %s accepted epoch %d after epoch %d", k, e, highest[k]))
		}
		highest[k] = max(highest[k], e)
		id := fmt.Sprintf("%s@%d", k, e)
		if prev, ok := gOwner[id]; ok && prev != o {
			v = append(v, fmt.Sprintf("guard: %s accepted from %s and %s", id, prev, o))
		}
		gOwner[id] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// The cluster's own fenced writes, on the final primary.
	leader, err := w.c.WaitHealthy(withTimeout(ctx, 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := leader.Connect(ctx, dbName)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err = conn.Query(ctx, `SELECT seq, key, owner, epoch FROM ha_writes`)
	if err != nil {
		t.Fatal(err)
	}
	present := map[int64]bool{}
	cOwner := map[string]string{}
	for rows.Next() {
		var seq, e int64
		var k, o string
		if err := rows.Scan(&seq, &k, &o, &e); err != nil {
			t.Fatal(err)
		}
		present[seq] = true
		id := fmt.Sprintf("%s@%d", k, e)
		if prev, ok := cOwner[id]; ok && prev != o {
			v = append(v, fmt.Sprintf("cluster: fenced writes of %s by %s and %s", id, prev, o))
		}
		cOwner[id] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if w.ops != nil {
		// The operators' store (in the cluster): per ConfigMap, in the
		// order the guard accepted them, epochs never go back, each
		// from one writer.
		rows, err = conn.Query(ctx, `SELECT resource, writer, epoch FROM operator_audit ORDER BY resource, seq`)
		if err != nil {
			t.Fatal(err)
		}
		high, by := map[string]int64{}, map[string]string{}
		for rows.Next() {
			var r, o string
			var e int64
			if err := rows.Scan(&r, &o, &e); err != nil {
				t.Fatal(err)
			}
			if e < high[r] {
				v = append(v, fmt.Sprintf("operator store: %s accepted epoch %d after epoch %d", r, e, high[r]))
			}
			high[r] = max(high[r], e)
			id := fmt.Sprintf("%s@%d", r, e)
			if prev, ok := by[id]; ok && prev != o {
				v = append(v, fmt.Sprintf("operator store: %s accepted from %s and %s", id, prev, o))
			}
			by[id] = o
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	writes := w.allWrites()
	var lostWrites []string
	for _, wr := range writes {
		if wr.seq > 0 && !present[wr.seq] {
			lostWrites = append(lostWrites, fmt.Sprintf("%s@%d seq %d by %s (node port %d)", wr.key, wr.epoch, wr.seq, wr.who, wr.port))
		}
	}
	acked, checks, warned, lost := w.ledger.report()
	t.Logf("%s: %d terms, %d fenced writes acknowledged (%d accepted by the guard), %d missing on the final primary, %d more returned success with the cancelled-wait warning; ledger: %d calls acknowledged, %d with the warning, %d reads after a failed call, %d showed a lost change",
		w.mode, len(terms), len(writes), accepted, len(lostWrites), w.warned.Load(), acked, warned, checks, len(lost))
	if w.mode != patroni.Async {
		for _, l := range lostWrites {
			v = append(v, "acknowledged fenced write lost: "+l)
		}
		for _, l := range lost {
			v = append(v, "ledger: "+l)
		}
	} else if len(lost)+len(lostWrites) > 0 {
		t.Logf("async (allowed): %d fenced writes and %d ledger changes acknowledged and then lost", len(lostWrites), len(lost))
	}
	if checks == 0 {
		v = append(v, "ledger: no call ever failed across the failovers (the check never ran)")
	}
	if len(v) > 0 {
		shown := v
		if len(shown) > 30 {
			shown = shown[:30]
		}
		t.Errorf("%d violations:\n%s", len(v), strings.Join(shown, "\n"))
	}
}

// window is one fault's run, from the fault to a healthy cluster again.
type window struct{ from, to time.Time }

// safety is what one fault kind's windows broke: pairs of overlapping
// terms of a key (the later one began in a window) and (key, epoch) pairs
// granted to two owners (the second grant's term began in a window).
type safety struct{ twoHolders, epochTwice int }

func (w *world) safety(ws []window) safety {
	in := func(at time.Time) bool {
		for _, x := range ws {
			if !at.Before(x.from) && !at.After(x.to) {
				return true
			}
		}
		return false
	}
	var s safety
	terms := w.allTerms()
	sort.Slice(terms, func(i, j int) bool { return terms[i].start.Before(terms[j].start) })
	owner := map[string]string{}
	for i, b := range terms {
		id := fmt.Sprintf("%s@%d", b.key, b.epoch)
		if o, ok := owner[id]; ok && o != b.who && in(b.start) {
			s.epochTwice++
		}
		owner[id] = b.who
		if b.fromEvents || !in(b.start) {
			continue
		}
		for _, a := range terms[:i] {
			if a.key == b.key && !a.fromEvents && (a.end.IsZero() || b.start.Before(a.end)) {
				s.twoHolders++
			}
		}
	}
	return s
}

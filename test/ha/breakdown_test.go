package ha

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// part is one step of the way from a promotion to a key's first fenced
// write, timed from the promotion. The breakdown of a failover is a list
// of them, in the order given by parts below.
type part struct {
	name string
	d    time.Duration
}

// breakdown times, after promotion p at t0's fault, what the cluster and
// every key went through until its first fenced write (got): when a
// standby streamed from the new primary and its first commit returned, and
// per key when a candidate first connected to it, when the call that
// granted or renewed the lease was sent and answered, when a term began
// there, and the write.
func (w *world) breakdown(t0 time.Time, old string, p promotion, got map[string]write) []part {
	var out []part
	since := func(at time.Time) time.Duration { return max(at.Sub(p.at), 0) }
	add := func(name string, at time.Time) {
		if !at.IsZero() {
			out = append(out, part{name, since(at)})
		}
	}
	var named time.Time
	for _, rs := range w.probe.replSince(p.node.Name, p.at) {
		if !rs.primary {
			continue
		}
		if rs.streaming > 0 && !slices.ContainsFunc(out, func(x part) bool { return x.name == "standby streaming" }) {
			add("standby streaming", rs.at)
		}
		if named.IsZero() && rs.syncNames != "" && rs.syncNames != "*" && rs.at.After(p.at) {
			named = rs.at
		}
	}
	// A primary left running (its Patroni killed) keeps the candidates'
	// connections until it is demoted or stopped.
	var oldLast time.Time
	for _, rs := range w.probe.replSince(old, p.at) {
		if rs.primary && rs.at.After(p.at) {
			oldLast = rs.at
		}
	}
	add("old primary last seen primary", oldLast)
	var commit time.Time
	select {
	case commit = <-p.commit:
		add("first commit", commit)
	case <-time.After(15 * time.Second):
	}
	add("standby named synchronous", named)
	grace, granted := w.serverSteps(p)
	add("grace ends", grace)
	port := p.node.Port
	for _, k := range w.keys {
		if k == operatorKey {
			continue
		}
		if c, ok := w.calls.first(k, port, p.at, func(c call) bool { return c.kind == "connect" && c.ok }); ok {
			add(k+" connected", c.end)
		}
		// The call that took or kept the lease: the first acquire or renew
		// answered once commits were possible (one sent before waited).
		if c, ok := w.calls.first(k, port, p.at, func(c call) bool {
			return c.ok && (c.kind == "acquire" || c.kind == "renew") && !c.end.Before(commit)
		}); ok {
			add(k+" lease call sent", c.start)
			add(k+" lease call answered", c.end)
		}
		add(k+" granted", granted[k])
		began := w.termAfter(k, p.at)
		add(k+" term began", began)
		// The fenced write's own steps: its insert in the cluster and its
		// commit (the guard's write follows).
		from := p.at
		if !began.IsZero() {
			from = began
		}
		if c, ok := w.calls.first(k, 0, from, func(c call) bool { return strings.HasPrefix(c.kind, "write failed") }); ok {
			w.t.Logf("%s: first failed fenced write after %v: +%v %s", k, from.Sub(p.at).Round(time.Millisecond), c.end.Sub(p.at).Round(time.Millisecond), c.kind)
		}
		if c, ok := w.calls.first(k, port, from, func(c call) bool { return c.ok && c.kind == "write" }); ok {
			add(k+" write's insert sent", c.start)
			if cm, ok := w.calls.first(k, port, c.end, func(x call) bool { return x.ok && x.kind == "commit" && x.who == c.who }); ok {
				add(k+" write's commit answered", cm.end)
			}
		}
		if !commit.IsZero() {
			// Calls while no commit could succeed: a candidate that asks
			// again at once when refused spins here.
			n := w.calls.count(k, p.at, commit)
			out = append(out, part{k + " calls before the first commit", time.Duration(n)})
		}
		add(k+" write", got[k].at)
	}
	if w.ops != nil {
		starts, term, leading := w.ops.since(t0, p.at)
		if starts > 0 {
			out = append(out, part{"operator processes started since the fault", time.Duration(starts)})
		}
		add("operator term began", term)
		add("operator leading", leading)
		add("operator write", got[operatorKey].at)
	}
	return out
}

// serverSteps reads, on the node promoted at p, when pg_lease's grace
// after the promotion ends (lease.status; zero if it ended before the
// promotion, as in strict mode, where there is none) and, per key, when
// its first grant after the promotion was made there (lease.history's
// first acquired or taken_over event: the granting statement's time on
// the server's clock, which is this machine's).
func (w *world) serverSteps(p promotion) (grace time.Time, granted map[string]time.Time) {
	granted = map[string]time.Time{}
	ctx, cancel := context.WithTimeout(w.runCtx, 10*time.Second)
	defer cancel()
	conn, err := p.node.Connect(ctx, dbName)
	if err != nil {
		w.t.Logf("breakdown: %s: %v", p.node.Name, err)
		return grace, granted
	}
	defer conn.Close(context.Background())
	var g *time.Time
	if err := conn.QueryRow(ctx, `SELECT grace_until FROM lease.status()`).Scan(&g); err != nil {
		w.t.Logf("breakdown: lease.status on %s: %v", p.node.Name, err)
	} else if g != nil && g.After(p.at) {
		grace = *g
	}
	for _, k := range w.keys {
		if k == operatorKey {
			continue
		}
		var at *time.Time
		if err := conn.QueryRow(ctx, `SELECT min(h.at) FROM lease.history($1, 10000) h
			WHERE h.event IN ('acquired', 'taken_over') AND h.at > $2`, k, p.at).Scan(&at); err != nil {
			w.t.Logf("breakdown: lease.history(%s) on %s: %v", k, p.node.Name, err)
		} else if at != nil {
			granted[k] = *at
		}
	}
	return grace, granted
}

// termAfter is when the first term of key that began after at began (zero
// if none did: the leader kept its term).
func (w *world) termAfter(key string, at time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, tr := range w.terms {
		if tr.key == key && tr.start.After(at) && (first.IsZero() || tr.start.Before(first)) {
			first = tr.start
		}
	}
	return first
}

// since counts the operator processes started after t0, and returns when
// the first term after at began (epoch-start) and the first manager after
// at led (leading).
func (o *operators) since(t0, at time.Time) (starts int, term, leading time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range o.events {
		switch {
		case ev.Event == "start" && ev.at.After(t0):
			starts++
		case ev.Event == "epoch-start" && ev.at.After(at) && term.IsZero():
			term = ev.at
		case ev.Event == "leading" && ev.at.After(at) && leading.IsZero():
			leading = ev.at
		}
	}
	return starts, term, leading
}

// countPart marks a part that counts (processes), not a time.
func countPart(name string) bool {
	return strings.HasPrefix(name, "operator processes") || strings.HasSuffix(name, "calls before the first commit")
}

func formatParts(ps []part) string {
	var s []string
	for _, x := range ps {
		if countPart(x.name) {
			s = append(s, fmt.Sprintf("%s %d", x.name, int64(x.d)))
			continue
		}
		s = append(s, fmt.Sprintf("%s +%v", x.name, x.d.Round(time.Millisecond)))
	}
	return strings.Join(s, ", ")
}

// partLines summarizes the breakdowns of one mode and fault kind: per
// part, its median and maximum over the failovers where it was seen.
func partLines(prefix string, ss []sample) []string {
	var names []string
	by := map[string][]time.Duration{}
	for _, s := range ss {
		for _, x := range s.parts {
			if _, ok := by[x.name]; !ok {
				names = append(names, x.name)
			}
			by[x.name] = append(by[x.name], x.d)
		}
	}
	var out []string
	for _, n := range names {
		d := by[n]
		slices.Sort(d)
		if countPart(n) {
			out = append(out, fmt.Sprintf("%s %s: p50 %d max %d (n=%d)", prefix, n, int64(median(d)), int64(d[len(d)-1]), len(d)))
			continue
		}
		out = append(out, fmt.Sprintf("%s %s: p50 %.2fs max %.2fs (n=%d)", prefix, n, median(d).Seconds(), d[len(d)-1].Seconds(), len(d)))
	}
	return out
}

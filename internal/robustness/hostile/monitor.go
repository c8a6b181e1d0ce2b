package hostile

import (
	"context"
	"fmt"
	"time"
)

// The documented caps (docs/operations.md, specs/SEMANTICS.md 16).
const (
	listenCap     = 1000 // registrations of keys per session ('*' besides)
	candidatesCap = 1024 // candidate registrations per role
	strategiesCap = 1024 // keys with a strategy per role
)

// monitor reads what the installer (a superuser) sees, through the whole
// run: every honest key's row (the epochs, and client-go's IsLeader
// against the key's holder), the history (handovers), which honest
// backends wait for which hostile ones, and the sizes of the tables that
// other roles can make grow.
func (e *env) monitor(ctx context.Context) {
	m := e.mon
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m.readKeys(ctx)
		if n%2 == 0 {
			m.scanHistory(ctx)
		}
		m.sampleWaits(ctx)
		if n%20 == 0 {
			m.sampleBounds(ctx)
		}
	}
}

func newMon(e *env) *mon {
	return &mon{e: e, histSeq: map[string]int64{}, waits: map[string]bool{}, isLeader: map[string]bool{}, bounds: map[string]bool{}}
}

type mon struct {
	e *env

	cgReads  []keyRead // client-go's key, the recent reads
	pending  []isLeaderSample
	isLeader map[string]bool

	histSeq   map[string]int64
	histSince time.Time

	waits  map[string]bool
	bounds map[string]bool
}

// keyRead is one read of a key's row by the installer.
type keyRead struct {
	sent, recv time.Duration
	epoch      int64
	held       bool
	role       string
	owner      string
}

// isLeaderSample: a candidate's IsLeader was true at at, after a Get that
// started after before was read.
type isLeaderSample struct {
	c      *cgCandidate
	at     time.Duration
	before keyRead
}

// heldBy reports whether r shows the key held by role.
func (r keyRead) heldBy(role string) bool { return r.held && r.role == role }

func (m *mon) readKeys(ctx context.Context) {
	e := m.e
	sent := e.rec.Now()
	rows, err := e.admin.Query(ctx, `SELECT key, coalesce(owner, ''), epoch, coalesce(holder_role, ''),
	       owner IS NOT NULL AND expires_at > clock_timestamp()
	  FROM lease.leases WHERE key = ANY ($1::text[])`, honestKeys())
	if err != nil {
		return
	}
	var reads []struct {
		key string
		r   keyRead
	}
	for rows.Next() {
		var k string
		var r keyRead
		if err := rows.Scan(&k, &r.owner, &r.epoch, &r.role, &r.held); err != nil {
			rows.Close()
			return
		}
		reads = append(reads, struct {
			key string
			r   keyRead
		}{k, r})
	}
	rows.Close()
	if rows.Err() != nil {
		return
	}
	recv := e.rec.Now()
	for _, x := range reads {
		x.r.sent, x.r.recv = sent, recv
		e.rec.Observe(x.key, "installer", "leases", x.r.epoch, sent, recv)
		if x.key == clientGoKey {
			m.clientGo(x.r)
		}
	}
}

// clientGo is check (7). A sample of IsLeader = true is judged by the
// first read of the key sent after it: when that read and the last read
// received before the candidate's last completed Get started show the same
// epoch, and neither shows the key held by the candidate's role, then no
// grant of the key was made in between: client-go read the key during
// that time (the Get) and still calls itself leader.
func (m *mon) clientGo(r keyRead) {
	e := m.e
	keep := m.pending[:0]
	for _, p := range m.pending {
		if r.sent <= p.at {
			keep = append(keep, p)
			continue
		}
		b := p.before
		if b.epoch == r.epoch && !b.heldBy(roleClientGo) && !r.heldBy(roleClientGo) {
			id := fmt.Sprintf("%s@%d", p.c.id, r.epoch)
			if !m.isLeader[id] {
				m.isLeader[id] = true
				state := "free"
				if r.held {
					state = fmt.Sprintf("held by %q of role %s", r.owner, r.role)
				}
				e.rec.Violate(CheckIsLeader, "client-go %s: IsLeader() true at %.3fs, after a Get that began at or after %.3fs, while %s stayed %s at epoch %d from %.3fs to %.3fs",
					p.c.id, p.at.Seconds(), b.recv.Seconds(), clientGoKey, state, r.epoch, b.recv.Seconds(), r.sent.Seconds())
			}
		}
	}
	m.pending = keep
	m.cgReads = append(m.cgReads, r)
	if len(m.cgReads) > 400 {
		m.cgReads = m.cgReads[len(m.cgReads)-200:]
	}
	e.cgMu.Lock()
	cgs := append([]*cgCandidate(nil), e.cgs...)
	e.cgMu.Unlock()
	for _, c := range cgs {
		le := c.le.Load()
		if le == nil {
			continue
		}
		getStart, ok := c.lastGet() // before IsLeader: what IsLeader reflects began no earlier
		if !ok || !le.IsLeader() {
			continue
		}
		at := e.rec.Now()
		var before *keyRead
		for i := len(m.cgReads) - 1; i >= 0; i-- {
			if m.cgReads[i].recv < getStart {
				before = &m.cgReads[i]
				break
			}
		}
		if before != nil && !before.heldBy(roleClientGo) {
			m.pending = append(m.pending, isLeaderSample{c: c, at: at, before: *before})
		}
	}
}

// scanHistory reads the history rows written since the last scan: every
// handover made by an honest role's release must go to a candidate of
// that role (check 2), and each key's events carry growing epochs.
func (m *mon) scanHistory(ctx context.Context) {
	e := m.e
	since := m.histSince.Add(-5 * time.Second)
	rows, err := e.admin.Query(ctx, `SELECT key, seq, at, event, coalesce(owner, ''), coalesce(holder_role, ''),
	       coalesce(epoch, 0), actor, coalesce(previous_owner, ''), coalesce(previous_epoch, 0)
	  FROM lease.history WHERE at >= $1 ORDER BY key, seq`, since)
	if err != nil {
		return
	}
	defer rows.Close()
	recv := e.rec.Now()
	for rows.Next() {
		var (
			key, event, owner, role, actor, prevOwner string
			seq, epoch, prevEpoch                     int64
			at                                        time.Time
		)
		if err := rows.Scan(&key, &seq, &at, &event, &owner, &role, &epoch, &actor, &prevOwner, &prevEpoch); err != nil {
			return
		}
		if at.After(m.histSince) {
			m.histSince = at
		}
		last := m.histSeq[key]
		if seq <= last {
			continue
		}
		if last > 0 && seq > last+1 && isHonestKey(key) {
			e.rec.Count("history: events of honest keys trimmed before the monitor read them", int(seq-last-1))
		}
		m.histSeq[key] = seq
		if event == "acquired" || event == "taken_over" || event == "handed_over" {
			e.rec.Observe(key, "installer", "history", epoch, -1, recv)
		}
		if event == "handed_over" {
			e.rec.Count("history: handovers", 1)
			if honestRoleSet[actor] && role != actor && !e.judged(key, epoch) {
				e.rec.Violate(CheckHandover, "%s: %q of role %s released epoch %d; the release handed the key to %q of role %s (epoch %d), not a candidate of %s",
					key, prevOwner, actor, prevEpoch, owner, role, epoch, actor)
			}
		}
	}
}

// sampleWaits is check (8): an honest backend waiting for a lock held by a
// hostile backend whose transaction is open after calls that changed no
// honest key (registry.leftBehind).
func (m *mon) sampleWaits(ctx context.Context) {
	e := m.e
	var honest []string
	for r := range honestRoleSet {
		honest = append(honest, r)
	}
	before := e.reg.signatures()
	rows, err := e.admin.Query(ctx, `SELECT w.pid, w.usename::text, left(w.query, 160), b.pid, b.usename::text,
	       b.state IS NOT DISTINCT FROM 'idle in transaction'
	  FROM pg_stat_activity w
	  CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp(pid)
	  JOIN pg_stat_activity b ON b.pid = bp.pid
	 WHERE w.wait_event_type = 'Lock' AND w.usename::text = ANY ($1::text[]) AND b.usename::text = ANY ($2::text[])`,
		honest, hostileRoles)
	if err != nil {
		return
	}
	type wait struct {
		wpid, bpid   uint32
		wrole, brole string
		query        string
		idle         bool
	}
	var waits []wait
	for rows.Next() {
		var w wait
		if err := rows.Scan(&w.wpid, &w.wrole, &w.query, &w.bpid, &w.brole, &w.idle); err != nil {
			rows.Close()
			return
		}
		waits = append(waits, w)
	}
	rows.Close()
	if rows.Err() != nil {
		return
	}
	after := e.reg.signatures()
	for _, w := range waits {
		desc, tx, ok := e.reg.leftBehind(w.bpid)
		if !ok {
			e.rec.Count("waits: for a hostile call running, or a change of an honest key ("+e.reg.kind(w.bpid)+")", 1)
			continue
		}
		// The hostile backend's state must be the same before and after
		// the read, and idle in its transaction: then the read saw it.
		if !w.idle || before[w.bpid] != after[w.bpid] {
			e.rec.Count("waits: for a hostile backend whose state changed during the read", 1)
			continue
		}
		e.rec.Count("waits: honest backend waiting for a hostile open transaction", 1)
		id := fmt.Sprintf("%d/%s", w.wpid, tx)
		if m.waits[id] {
			continue
		}
		m.waits[id] = true
		e.rec.Violate(CheckWaits, "a backend of %s running %q waits for %s's transaction, open after calls that changed no honest key: %s",
			w.wrole, w.query, w.brole, desc)
	}
}

// sampleBounds is check (4) during the run.
func (m *mon) sampleBounds(ctx context.Context) {
	e := m.e
	var perSession, listeners, perKey, history, perRoleCand, perRoleStrat, keep, maxConn int64
	err := e.admin.QueryRow(ctx, `SELECT
	  coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM lease.listeners WHERE key <> '*' GROUP BY pid) x), 0),
	  (SELECT count(*) FROM lease.listeners),
	  coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM lease.history GROUP BY key, actor) y), 0),
	  (SELECT count(*) FROM lease.history),
	  coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM lease.candidates GROUP BY role) z), 0),
	  coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM lease.strategies GROUP BY role) s), 0),
	  coalesce((SELECT keep_rows FROM lease.history_settings), 100),
	  current_setting('max_connections')::bigint`).
		Scan(&perSession, &listeners, &perKey, &history, &perRoleCand, &perRoleStrat, &keep, &maxConn)
	if err != nil {
		return
	}
	e.rec.Max("bounds: listeners rows", listeners)
	e.rec.Max("bounds: listeners rows of one session", perSession)
	e.rec.Max("bounds: history rows", history)
	e.rec.Max("bounds: history rows of one key and actor", perKey)
	e.rec.Max("bounds: candidates of one role", perRoleCand)
	e.rec.Max("bounds: strategies of one role", perRoleStrat)
	over := func(what string, n, limit int64) {
		if n > limit && !m.bounds[what] {
			m.bounds[what] = true
			e.rec.Violate(CheckBounds, "%s: %d, above the documented cap %d", what, n, limit)
		}
	}
	over("registrations (lease.listeners) of one session", perSession, listenCap)
	over("registrations (lease.listeners) in all", listeners, (listenCap+1)*maxConn)
	over("history rows of one key written by one role", perKey, keep)
	over("candidate registrations of one role", perRoleCand, candidatesCap)
	over("keys with a strategy of one role", perRoleStrat, strategiesCap)
}

// finalChecks runs once every part has stopped: the last history rows, the
// sizes at the end, and the installer's own calls in the database, which
// must not run any other role's objects.
func (e *env) finalChecks(ctx context.Context) {
	e.mon.scanHistory(ctx)
	e.mon.sampleBounds(ctx)
	e.installerCalls(ctx)
}

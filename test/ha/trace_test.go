package ha

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// call is one connection attempt or query of an in-process candidate: what
// it was, on which node, when it was sent and answered, and whether it
// succeeded. The breakdown after each promotion reads them.
type call struct {
	key, who, kind string
	port           int // 0: no connection was made
	start, end     time.Time
	ok             bool
}

// callLog keeps every call of the candidates' pools.
type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) add(c call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// first returns the earliest answered call of key on port sent after
// after, for which match is true.
func (l *callLog) first(key string, port int, after time.Time, match func(call) bool) (call, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best call
	found := false
	for _, c := range l.calls {
		if c.key != key || c.port != port || c.start.Before(after) || !match(c) {
			continue
		}
		if !found || c.end.Before(best.end) {
			best, found = c, true
		}
	}
	return best, found
}

// count is how many lease calls (acquire, renew, release, inspect) of key
// were sent in [from, to].
func (l *callLog) count(key string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		switch c.kind {
		case "acquire", "renew", "release", "inspect":
			if c.key == key && !c.start.Before(from) && !c.start.After(to) {
				n++
			}
		}
	}
	return n
}

// option traces the pool's connections and queries as candidate who of key.
func (l *callLog) option(key, who string) pgtest.PoolOption {
	return func(c *pgxpool.Config) { c.ConnConfig.Tracer = &tracer{log: l, key: key, who: who} }
}

// tracer is a pgx.QueryTracer and pgx.ConnectTracer that records the calls
// of one candidate.
type tracer struct {
	log      *callLog
	key, who string
}

type traceStart struct{}

type started struct {
	kind string
	at   time.Time
}

// kindOf names a query by the pg_lease function it calls, or by what the
// test writes; "" for the rest (not recorded).
func kindOf(sql string) string {
	for _, f := range []string{"acquire", "renew", "release", "inspect"} {
		if strings.Contains(sql, "lease."+f+"(") {
			return f
		}
	}
	switch {
	case strings.Contains(sql, "INSERT INTO ha_writes"):
		return "write"
	case strings.EqualFold(strings.TrimSpace(sql), "commit"):
		return "commit"
	}
	return ""
}

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceStart{}, started{kind: kindOf(data.SQL), at: time.Now()})
}

func (t *tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	end := time.Now()
	s, ok := ctx.Value(traceStart{}).(started)
	if !ok || s.kind == "" {
		return
	}
	t.log.add(call{key: t.key, who: t.who, kind: s.kind, port: portOf(conn), start: s.at, end: end, ok: data.Err == nil})
}

func (t *tracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, traceStart{}, started{kind: "connect", at: time.Now()})
}

func (t *tracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	end := time.Now()
	s, ok := ctx.Value(traceStart{}).(started)
	if !ok {
		return
	}
	t.log.add(call{key: t.key, who: t.who, kind: s.kind, port: portOf(data.Conn), start: s.at, end: end, ok: data.Err == nil})
}

// portOf is the server port conn is connected to (0 if none).
func portOf(conn *pgx.Conn) int {
	if conn == nil || conn.PgConn() == nil || conn.PgConn().Conn() == nil {
		return 0
	}
	if a, ok := conn.PgConn().Conn().RemoteAddr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// await waits until a call for which match is true was logged.
func (l *callLog) await(ctx context.Context, match func(call) bool) error {
	for {
		l.mu.Lock()
		found := slices.ContainsFunc(l.calls, match)
		l.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cutCalls counts the calls that end in a commit (lease calls, which
// commit as they return, and explicit commits) sent to port after after
// and answered by an error, per kind.
type cutCalls struct {
	n     int
	kinds string
}

func (l *callLog) cut(port int, after time.Time) cutCalls {
	l.mu.Lock()
	defer l.mu.Unlock()
	by := map[string]int{}
	var c cutCalls
	for _, x := range l.calls {
		if x.port != port || x.ok || x.start.Before(after) {
			continue
		}
		switch x.kind {
		case "acquire", "renew", "release", "commit":
			by[x.kind]++
			c.n++
		}
	}
	var parts []string
	for _, k := range []string{"acquire", "renew", "release", "commit"} {
		if by[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
		}
	}
	c.kinds = strings.Join(parts, ", ")
	return c
}

// portAt is the port of key's last successful call answered at or before at.
func (l *callLog) portAt(key string, at time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	port := 0
	for _, c := range l.calls {
		if c.key == key && c.ok && c.port != 0 && !c.end.After(at) {
			port = c.port
		}
	}
	return port
}

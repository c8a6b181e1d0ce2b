package pgtest

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statement is one statement a traced connection sent: when it was sent,
// its text and its arguments.
type Statement struct {
	At   time.Time
	SQL  string
	Args []any
}

// Calls reports whether the statement's text calls fn ("lease.renew").
func (s Statement) Calls(fn string) bool { return strings.Contains(s.SQL, fn+"(") }

// Statements records the statements sent on the connections it traces: a
// pgx.QueryTracer (ConnConfig.Tracer; Traced for NewPool).
type Statements struct{ log Log[Statement] }

// Traced is a NewPool option: the pool's connections are traced by s.
func (s *Statements) Traced(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = s }

// TraceQueryStart records the statement.
func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.log.Add(Statement{At: time.Now(), SQL: d.SQL, Args: append([]any(nil), d.Args...)})
	return ctx
}

// TraceQueryEnd does nothing.
func (s *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// All is every statement recorded so far, in the order sent.
func (s *Statements) All() []Statement { return s.log.All() }

// Calling is the statements recorded so far whose text calls fn, in order.
func (s *Statements) Calling(fn string) []Statement {
	var out []Statement
	for _, st := range s.log.All() {
		if st.Calls(fn) {
			out = append(out, st)
		}
	}
	return out
}

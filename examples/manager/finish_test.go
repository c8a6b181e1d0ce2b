package main

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// TestFinishOnStop: a stopping process lets its queries finish (no cancel
// request), and a renewal past its deadline is still interrupted at once.
func TestFinishOnStop(t *testing.T) {
	pgtest.CheckFinishOnStop(t, func(c *pgconn.PgConn) ctxwatch.Handler { return finishOnStop{c.Conn()} })
}

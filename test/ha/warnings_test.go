package ha

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// syncWarnings counts, per connection and in all, the notices that say a
// commit's wait for the synchronous standbys was cancelled ("... committed
// locally, but might not have been replicated"). Such a commit returned
// success without being replicated: its outcome is unknown, and the test
// does not count it as acknowledged.
type syncWarnings struct {
	m     sync.Map // *pgconn.PgConn → *atomic.Int64
	total atomic.Int64
}

func (s *syncWarnings) option() pgtest.PoolOption {
	return func(c *pgxpool.Config) {
		next := c.ConnConfig.OnNotice
		c.ConnConfig.OnNotice = func(pc *pgconn.PgConn, n *pgconn.Notice) {
			if strings.Contains(n.Message, "wait for synchronous replication") {
				s.of(pc).Add(1)
				s.total.Add(1)
			}
			if next != nil {
				next(pc, n)
			}
		}
	}
}

func (s *syncWarnings) of(pc *pgconn.PgConn) *atomic.Int64 {
	v, _ := s.m.LoadOrStore(pc, new(atomic.Int64))
	return v.(*atomic.Int64)
}

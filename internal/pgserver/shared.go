package pgserver

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// Shared returns the server shared by the whole process: the external
// server of PGLEASE_TEST_DSN when that is set, otherwise a throwaway server
// started on first use (close it with CloseShared). Its control methods
// (Kill, Freeze, ...) refuse with ErrNeedsThrowaway. Users of it should take
// a database of their own (NewDatabase). A failure to start is remembered:
// later calls return the same error.
func Shared(ctx context.Context) (*Server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil || shared.err != nil {
		return shared.srv, shared.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var s *Server
	var err error
	if dsn := os.Getenv(EnvTestDSN); dsn != "" {
		s, err = External(ctx, dsn)
	} else {
		s, err = Start(ctx, Options{})
	}
	if err != nil {
		shared.err = fmt.Errorf("pgserver: shared server: %w", err)
		return nil, shared.err
	}
	s.shared = !s.external
	shared.srv = s
	return s, nil
}

// CloseShared closes the shared server if one was started.
func CloseShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	s := shared.srv
	shared.srv, shared.err = nil, nil
	if s == nil {
		return nil
	}
	return s.Close()
}

// NewDatabaseNamed is NewDatabase returning the database's name as well
// (to drop it with DropDatabase).
func (s *Server) NewDatabaseNamed(ctx context.Context) (name, dsn string, err error) {
	return s.newDatabase(ctx)
}

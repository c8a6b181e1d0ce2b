package pgtest

import (
	"sync"
	"testing"
	"time"
)

// Log is a list that goroutines add to and a test reads a copy of.
type Log[T any] struct {
	mu    sync.Mutex
	items []T
}

// Add appends v.
func (l *Log[T]) Add(v T) {
	l.mu.Lock()
	l.items = append(l.items, v)
	l.mu.Unlock()
}

// All is a copy of everything added so far, in order.
func (l *Log[T]) All() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.items...)
}

// Events reads what a test's processes report on a channel (their output
// lines, parsed) and keeps every value it has read.
type Events[T any] struct {
	ch   <-chan T
	seen Log[T]
}

// NewEvents reads from ch.
func NewEvents[T any](ch <-chan T) *Events[T] { return &Events[T]{ch: ch} }

// Await reads until a value matches and returns it; it fails the test when
// none has within d: "timed out waiting for <what>", and every value read.
func (e *Events[T]) Await(t testing.TB, d time.Duration, what string, match func(T) bool) T {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case v := <-e.ch:
			e.seen.Add(v)
			if match(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s; read so far: %+v", what, e.Seen())
		}
	}
}

// Seen is every value read so far, in order.
func (e *Events[T]) Seen() []T { return e.seen.All() }

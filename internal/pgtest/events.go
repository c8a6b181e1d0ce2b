package pgtest

import (
	"sync"
	"testing"
	"time"
)

// Events reads what a test's processes report on a channel (their output
// lines, parsed) and keeps every value it has read.
type Events[T any] struct {
	ch   <-chan T
	mu   sync.Mutex
	seen []T
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
			e.mu.Lock()
			e.seen = append(e.seen, v)
			e.mu.Unlock()
			if match(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s; read so far: %+v", what, e.Seen())
		}
	}
}

// Seen is every value read so far, in order.
func (e *Events[T]) Seen() []T {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]T(nil), e.seen...)
}

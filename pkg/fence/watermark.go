package fence

import (
	"sync"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Watermark is an in-memory guard for stores that are not SQL databases
// (a file, an object store client, a device): it keeps the highest epoch
// accepted per resource and runs each write under a per-resource lock, so
// the check and the write cannot interleave with another writer's. It is
// the model of what such a store must do itself when the writers run in
// other processes: keep the watermark next to the data, and compare and
// write atomically (a conditional put, a compare-and-swap). The zero value
// is ready to use.
type Watermark struct {
	mu  sync.Mutex
	res map[string]*mark
}

type mark struct {
	mu      sync.Mutex
	highest int64
}

func (w *Watermark) mark(resource string) *mark {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.res == nil {
		w.res = map[string]*mark{}
	}
	m := w.res[resource]
	if m == nil {
		m = &mark{}
		w.res[resource] = m
	}
	return m
}

// Do runs write for resource if token's epoch is at least the highest
// accepted so far, and then records it (only if write succeeded). A lower
// epoch gets a *StaleError (matching ErrStale) and write is not called.
// Writes to one resource run one at a time.
func (w *Watermark) Do(resource string, token lease.Token, write func() error) error {
	m := w.mark(resource)
	m.mu.Lock()
	defer m.mu.Unlock()
	if token.Epoch < m.highest {
		return &StaleError{Resource: resource, Epoch: token.Epoch, Highest: m.highest}
	}
	if write != nil {
		if err := write(); err != nil {
			return err
		}
	}
	m.highest = token.Epoch
	return nil
}

// Highest returns the highest epoch accepted for resource (0 if none).
func (w *Watermark) Highest(resource string) int64 {
	m := w.mark(resource)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.highest
}

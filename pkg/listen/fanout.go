package listen

// The fan-out: each notification goes to the subscribers of its key, and a
// resync tells them that notifications may have been missed.

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/utils/clock"
)

// watcher is one Watch subscription.
type watcher struct {
	ch   chan Event
	keys map[string]bool // nil: every key
	lost bool            // an event was dropped: send a resync first
	seqs bool            // events carry their dispatch count (Changes)
	stop func() bool     // context.AfterFunc's
}

func (wt *watcher) wants(key string) bool { return wt.keys == nil || wt.keys[key] }

// fanout holds the Watch subscriptions. It has a lock of its own; it never
// calls out while holding it.
type fanout struct {
	clk clock.PassiveClock

	mu       sync.Mutex
	closed   bool
	watchers map[*watcher]struct{}
	seq      uint64 // notifications and resyncs dispatched
}

// add subscribes wt; false once the fan-out is closed.
func (f *fanout) add(wt *watcher) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if f.watchers == nil {
		f.watchers = map[*watcher]struct{}{}
	}
	f.watchers[wt] = struct{}{}
	return true
}

// remove ends wt's subscription and closes its channel; false when it had
// ended already.
func (f *fanout) remove(wt *watcher) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.watchers[wt]; !ok {
		return false
	}
	delete(f.watchers, wt)
	close(wt.ch)
	return true
}

// close ends every subscription.
func (f *fanout) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for wt := range f.watchers {
		wt.stop()
		delete(f.watchers, wt)
		close(wt.ch)
	}
}

func (f *fanout) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// dispatched is the number of notifications and resyncs dispatched so far.
func (f *fanout) dispatched() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// resync tells the subscribers of key ("*": every subscriber) that
// notifications may have been lost.
func (f *fanout) resync(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	now := f.clk.Now()
	for wt := range f.watchers {
		if key == "*" || wt.wants(key) {
			wt.lost = true
			flush(wt, now, f.seq)
		}
	}
}

type payload struct {
	Event string `json:"event"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
}

// parse reads a notification's payload; false when it is not one of
// pg_lease's.
func parse(n *pgconn.Notification, now time.Time) (Event, bool) {
	var p payload
	if json.Unmarshal([]byte(n.Payload), &p) != nil || p.Key == "" {
		return Event{}, false
	}
	return Event{Type: EventType(p.Event), Key: p.Key, Owner: p.Owner, Epoch: p.Epoch, Received: now}, true
}

// notify sends ev to the subscribers of its key.
func (f *fanout) notify(ev Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	for wt := range f.watchers {
		if !wt.wants(ev.Key) {
			continue
		}
		flush(wt, ev.Received, f.seq)
		if wt.lost {
			continue
		}
		e := ev
		if wt.seqs {
			e.seq = f.seq
		}
		select {
		case wt.ch <- e:
		default:
			wt.lost = true
		}
	}
}

// flush sends a pending resync event if there is room. Its dispatch count
// is seq, the count when it is sent: every event it stands for was
// dispatched by then.
func flush(wt *watcher, now time.Time, seq uint64) {
	if !wt.lost {
		return
	}
	ev := Event{Type: EventResync, Received: now}
	if wt.seqs {
		ev.seq = seq
	}
	select {
	case wt.ch <- ev:
		wt.lost = false
	default:
	}
}

// setStop records the function that ends wt's context.AfterFunc.
func (f *fanout) setStop(wt *watcher, stop func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	wt.stop = stop
}

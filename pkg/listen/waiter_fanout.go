package listen

// The Waiter's fan-out: each notification goes to the subscribers of its
// key, and a resync tells them that notifications may have been missed.

import (
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

type watcher struct {
	ch   chan Event
	keys map[string]bool // nil: every key
	lost bool            // an event was dropped: send a resync first
	stop func() bool     // context.AfterFunc's
}

// dispatched is the number of notifications and resyncs dispatched so far.
func (w *Waiter) dispatched() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

// resync tells every subscriber that notifications may have been lost
// while no connection listened.
func (w *Waiter) resync() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	now := time.Now()
	for wt := range w.watchers {
		wt.lost = true
		flushLocked(wt, now)
	}
}

// resyncKeyLocked sends a resync event to the subscribers of key.
func (w *Waiter) resyncKeyLocked(key string) {
	w.seq++
	now := time.Now()
	for wt := range w.watchers {
		if key == "*" || wt.keys == nil || wt.keys[key] {
			wt.lost = true
			flushLocked(wt, now)
		}
	}
}

type payload struct {
	Event string `json:"event"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
}

func (w *Waiter) notified(n *pgconn.Notification) {
	now := time.Now()
	if n.Channel != channel {
		return
	}
	var p payload
	if err := json.Unmarshal([]byte(n.Payload), &p); err != nil || p.Key == "" {
		w.event("bad_payload", n.Payload)
		return
	}
	ev := Event{Type: EventType(p.Event), Key: p.Key, Owner: p.Owner, Epoch: p.Epoch, Received: now}
	w.event("notified", p.Key)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	for wt := range w.watchers {
		if wt.keys != nil && !wt.keys[p.Key] {
			continue
		}
		flushLocked(wt, now)
		if wt.lost {
			continue
		}
		select {
		case wt.ch <- ev:
		default:
			wt.lost = true
		}
	}
}

// flushLocked sends a pending resync event if there is room.
func flushLocked(wt *watcher, now time.Time) {
	if !wt.lost {
		return
	}
	select {
	case wt.ch <- Event{Type: EventResync, Received: now}:
		wt.lost = false
	default:
	}
}

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
)

// watch streams what happens to keys (every key when none is named) until
// interrupted: first the current state, then every grant, takeover, release
// and lapse, and renewals. Grants and releases come from the notifications
// that pg_lease sends on commit; a lapse sends nothing (expiry is lazy), nor
// does a renewal, so watch re-reads a key when its known expiry passes on the
// server's clock and reports either the lapse or the renewal it finds.
func (c *cli) watch(ctx context.Context, conn *pgx.Conn, keys []string) error {
	w, err := lease.NewWaiterConfig(ctx, c.cfg.Copy(), lease.WaiterOptions{})
	if err != nil {
		return err
	}
	defer w.Close()
	events := w.Watch(ctx, keys...) // subscribe before reading the state: nothing is missed in between
	client := lease.New(conn)
	wanted := map[string]bool{}
	for _, k := range keys {
		wanted[k] = true
	}

	known := map[string]lease.State{}
	resync := func() error {
		states, err := client.List(ctx)
		if err != nil {
			return err
		}
		for _, s := range states {
			if len(wanted) > 0 && !wanted[s.Key] {
				continue
			}
			old, seen := known[s.Key]
			if !seen || old.Held != s.Held || old.Epoch != s.Epoch || old.Owner != s.Owner {
				kind := "free"
				if s.Held {
					kind = "held"
				}
				c.event(kind, s)
			}
			known[s.Key] = s
		}
		return nil
	}
	if err := resync(); err != nil {
		return err
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Wake at the earliest known expiry, on the local clock.
		next, nextKey := time.Time{}, ""
		for k, s := range known {
			at := s.ExpiresLocal() // lease's one formula: never early
			if at.IsZero() {
				continue
			}
			at = at.Add(time.Millisecond)
			if next.IsZero() || at.Before(next) {
				next, nextKey = at, k
			}
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(max(wait, 0))

		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return ctx.Err()
			}
			if ev.Type == lease.EventResync {
				if err := resync(); err != nil {
					return err
				}
				continue
			}
			old := known[ev.Key]
			s := lease.State{Key: ev.Key, Exists: true, Epoch: ev.Epoch}
			kind := string(ev.Type)
			switch ev.Type {
			case lease.EventAcquired:
				st, err := client.Inspect(ctx, ev.Key)
				if err != nil {
					return err
				}
				s = st
				// A grant whose predecessor was never released (it lapsed,
				// seen or not) is a takeover.
				if ev.Type == lease.EventAcquired && old.Owner != "" {
					kind = "takeover"
				}
				s.Owner = ev.Owner
			case lease.EventReleased, lease.EventForceReleased:
				s.Owner = ev.Owner
				s.Epoch = ev.Epoch
			}
			c.event(kind, s)
			if ev.Type == lease.EventReleased || ev.Type == lease.EventForceReleased {
				s.Held, s.Owner = false, ""
			}
			known[ev.Key] = s
		case <-timer.C:
			if nextKey == "" {
				continue
			}
			s, err := client.Inspect(ctx, nextKey)
			if err != nil {
				return err
			}
			old := known[nextKey]
			if !s.Held && old.Held && s.Epoch == old.Epoch {
				old.Held = false // keep Owner: the next grant is a takeover
				c.event("lapsed", old)
				known[nextKey] = old
			} else {
				if s.Held && old.Held && s.Epoch == old.Epoch && s.ExpiresAt.After(old.ExpiresAt) {
					// Renewals send no notification: seen when the old expiry passes.
					c.event("renewed", s)
				}
				known[nextKey] = s
			}
		}
	}
}

// event prints one line: local time, what happened, key, holder, epoch and,
// for a held key, its server-time expiry.
func (c *cli) event(kind string, s lease.State) {
	holder := s.Owner
	if holder == "" {
		holder = "<none>"
	}
	line := fmt.Sprintf("%s  %-14s %s  holder=%s epoch=%d", time.Now().UTC().Format("15:04:05.000"), kind, s.Key, holder, s.Epoch)
	if s.Held {
		line += "  expires=" + s.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	fmt.Fprintln(c.out, c.redact(line))
}

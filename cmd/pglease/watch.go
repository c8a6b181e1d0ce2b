package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

var watchFormats = []string{"table", "json", "yaml"}

func (a *app) watchCmd() *cobra.Command {
	var (
		output string
		poll   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch [KEY...]",
		Short: "Stream grants, takeovers, renewals, releases and lapses as they happen",
		Long: `Print the current state of the keys (every key when none is named), then one line
per change until interrupted: acquired, takeover (a grant after a lapse), renewed,
released, force_released, lapsed.

Grants and releases show as they commit: a notification on channel pg_lease makes
watch read the key, and it prints what the key's state (and, from pg_lease 0.4.0,
its history) shows, never what the notification says: any role may send one.
Renewals and lapses send none: watch re-reads the keys every --poll (one query)
and at each known expiry, so a renewal shows within --poll and a lapse at its
expiry. When the server goes away (restart, failover) watch says so on
stderr, reconnects with backoff, says so again, and shows what changed meanwhile.

-o json prints one JSON object per line, -o yaml one document per event.`,
		Example: `  pglease watch job-42 job-43
  pglease watch -o json | jq .`,
		Args: args(0, -1, "KEY..."),
		RunE: a.runE("watch", func(cmd *cobra.Command, keys []string) error {
			if !slices.Contains(watchFormats, output) {
				return usagef("-o %s: want one of %s", quoteField(output), strings.Join(watchFormats, ", "))
			}
			for _, k := range keys {
				if err := checkKey(k); err != nil {
					return err
				}
			}
			if poll < 0 {
				return usagef("--poll %v: must not be negative", poll)
			}
			if len(keys) == 0 {
				keys = nil
			}
			return a.watch(cmd.Context(), keys, output, poll)
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: "+strings.Join(watchFormats, "|"))
	cmd.Flags().DurationVar(&poll, "poll", time.Second, "re-read the keys this often to show renewals (0: only at each expiry)")
	return cmd
}

// watcher is one watch: what it knows of each key and how it prints.
type watcher struct {
	a      *app
	format string
	keys   []string // nil: every key
	known  map[string]keyState
	sess   *session
	// started: the first state was printed; a key seen first after it is a
	// change (printed as events), not part of that state.
	started bool
}

func (a *app) watch(ctx context.Context, keys []string, format string, poll time.Duration) error {
	wt := &watcher{a: a, format: format, keys: keys, known: map[string]keyState{}, sess: &session{a: a}}
	defer wt.sess.drop()
	if _, err := wt.sess.get(ctx); err != nil {
		return err
	}
	w, err := listen.NewWaiter(ctx, a.cfg, listen.Options{})
	if err != nil {
		var pce *pgconn.ConnectError
		if errors.As(err, &pce) {
			return &connectError{err: pce}
		}
		return err
	}
	defer w.Close()
	// Subscribe before reading the state: nothing is missed in between.
	changes := listen.Subscribe(ctx, w, clock.RealClock{}, keys...)
	defer changes.Close()

	resync, first := true, true
	var (
		events []listen.Event // received, not yet shown
		closed bool           // the subscription ended
	)
	for {
		if resync {
			if err := wt.step(ctx, func(conn *pgx.Conn) error {
				return whole(ctx, func(ctx context.Context) error { return wt.resync(ctx, conn) })
			}); err != nil {
				return err
			}
			wt.started = true
			if first {
				a.logf("watch: subscribed to notifications; state read")
				first = false
			}
			resync = false
		}
		if len(events) == 0 {
			if closed {
				return ctx.Err()
			}
			// Wake at the next poll or the earliest expiry, whichever first.
			// A lapse sends no notification: its local instant is the
			// client's (lease.State.ExpiresLocal, never early).
			wake := time.Hour
			if poll > 0 {
				wake = poll
			}
			until := time.Now().Add(wake)
			for _, s := range wt.known {
				until = listen.WakeAt(until, s.State)
			}
			wk, err := changes.Wait(ctx, until, nil)
			if err != nil {
				return nil
			}
			resync, events, closed = wk.Due, wk.Events, wk.Closed
		} else {
			ev := events[0]
			events = events[1:]
			if ev.Type == listen.EventResync {
				resync = true
				continue
			}
			if err := wt.step(ctx, func(conn *pgx.Conn) error {
				return whole(ctx, func(ctx context.Context) error { return wt.notified(ctx, conn, ev) })
			}); err != nil {
				return err
			}
		}
	}
}

// whole runs f's reads to their end (bounded by a minute) even when ctx
// ends meanwhile: an interrupt then waits for a read in flight instead of
// cutting it with a cancel request (which a PgBouncer in front may not
// survive), and watch stops after it.
func whole(ctx context.Context, f func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	return f(rctx)
}

// step runs f on the session's connection; when the connection is lost it
// says so, reconnects (with backoff, until ctx ends), says so, and re-reads
// the state.
func (wt *watcher) step(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := wt.sess.get(ctx)
	if err == nil {
		err = f(conn)
	}
	if err == nil || ctx.Err() != nil {
		return ctx.Err()
	}
	if !connLost(conn, err) {
		return err
	}
	wt.a.warnf("watch: connection lost (%s); reconnecting", connLostReason(err))
	backoff := 100 * time.Millisecond
	for {
		wt.sess.drop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
		conn, err := wt.sess.get(ctx)
		if err != nil {
			wt.a.logf("watch: reconnecting: %s", connLostReason(err))
			continue
		}
		if err := wt.resync(ctx, conn); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if connLost(conn, err) {
				continue
			}
			return err
		}
		wt.a.warnf("watch: reconnected; state re-read (changes while disconnected are shown as found)")
		return nil
	}
}

// resync reads the watched keys and prints what changed since last known.
func (wt *watcher) resync(ctx context.Context, conn *pgx.Conn) error {
	states, err := readStates(ctx, conn, wt.keys)
	if err != nil {
		return err
	}
	for _, n := range states {
		wt.update(ctx, conn, n)
	}
	return nil
}

// update prints the change from what watch knew of n's key to n and
// remembers what to know next.
func (wt *watcher) update(ctx context.Context, q lease.Querier, n keyState) {
	o, seen := wt.known[n.Key]
	if !seen && wt.started {
		// First seen after the first state: it was never leased before
		// (or was removed by clean-up).
		o, seen = keyState{State: lease.State{Key: n.Key}, Status: statusFree}, true
	}
	wt.known[n.Key] = wt.diff(ctx, q, o, seen, n)
}

// diff prints the change from o to n and returns what to remember. It reads
// the key's history (q) only to tell a release from a forced one, and to
// name the holder of a grant that came and went between two reads.
func (wt *watcher) diff(ctx context.Context, q lease.Querier, o keyState, seen bool, n keyState) keyState {
	switch {
	case !seen:
		wt.print(n.Status, n, n.Holder)
	case n.Held && o.Held && n.Epoch == o.Epoch:
		if n.ExpiresAt.After(o.ExpiresAt) {
			wt.print("renewed", n, n.Holder)
		}
	case n.Held:
		kind := "acquired"
		if o.Held || o.Status == statusLapsed {
			kind = "takeover" // the previous grant ended without a release
		}
		wt.print(kind, n, n.Holder)
	case o.Held && n.Epoch == o.Epoch:
		// Same epoch, not held: the grant lapsed. A server before
		// pg_lease 0.4.0 does not say so: the holder is the one watch saw.
		n.Status, n.Holder = statusLapsed, o.Holder
		if n.Since.IsZero() {
			n.Since = o.ExpiresAt
		}
		wt.print("lapsed", n, o.Holder)
	case o.Held:
		// Released while no read saw it.
		if n.Status == statusFree {
			n.Status = statusReleased
		}
		// Print the released grant's epoch, as its holder knew it.
		r := n
		r.Epoch = o.Epoch
		kind, _ := releaseOf(ctx, q, n.Key, o.Epoch)
		wt.print(kind, r, o.Holder)
	case n.Epoch > o.Epoch && n.Status == statusLapsed:
		// A grant watch never saw held, already lapsed.
		g := n
		g.Held, g.Status = true, statusHeld
		wt.print("acquired", g, n.Holder)
		wt.print("lapsed", n, n.Holder)
	case n.Epoch > o.Epoch && n.Status == statusReleased:
		// A grant watch never saw held, already released: its epoch is
		// one below the key's counter; the history names its holder.
		r := n
		r.Epoch = n.Epoch - 1
		kind, holder := releaseOf(ctx, q, n.Key, r.Epoch)
		if holder != "" {
			g := r
			g.Held, g.Status = true, statusHeld
			wt.print("acquired", g, holder)
		}
		wt.print(kind, r, holder)
	case n.Epoch == o.Epoch && n.Status == statusFree:
		// Nothing changed; keep what watch derived (lapsed, its holder).
		o.ServerNow = n.ServerNow
		return o
	}
	return n
}

// releaseOf reads, from the key's history (pg_lease 0.4.0), how the grant
// of epoch ended: "released" or "force_released", and its holder. Without
// a history that says (an older server, or the event no longer kept) it
// returns "released" and no holder.
func releaseOf(ctx context.Context, q lease.Querier, key string, epoch int64) (kind, holder string) {
	rows, err := q.Query(ctx, `SELECT h.event, h.owner, h.epoch FROM lease.history($1, 100) h`, key)
	if err != nil {
		return "released", ""
	}
	defer rows.Close()
	kind = "released"
	for rows.Next() {
		var (
			ev    string
			owner *string
			ep    *int64
		)
		if rows.Scan(&ev, &owner, &ep) != nil {
			return "released", ""
		}
		if ep != nil && *ep == epoch && (ev == "released" || ev == "force_released") {
			kind, holder = ev, ""
			if owner != nil {
				holder = *owner
			}
		}
	}
	if rows.Err() != nil {
		return "released", ""
	}
	return kind, holder
}

// notified handles one notification. Any role may NOTIFY pg_lease, so its
// payload is only a hint that the key may have changed: watch reads the
// key and prints what its state shows, nothing the payload says.
func (wt *watcher) notified(ctx context.Context, conn *pgx.Conn, ev listen.Event) error {
	if lease.CheckKey(ev.Key) != nil {
		return nil // no key's: the server would refuse to read it
	}
	states, err := readStates(ctx, conn, []string{ev.Key})
	if err != nil {
		return err
	}
	for _, n := range states {
		wt.update(ctx, conn, n)
	}
	return nil
}

// event is one watch line in json and yaml.
type event struct {
	Time      time.Time  `json:"time"`
	Event     string     `json:"event"`
	Key       string     `json:"key"`
	Holder    string     `json:"holder,omitempty"`
	Epoch     int64      `json:"epoch"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

func (wt *watcher) print(kind string, s keyState, holder string) {
	now := time.Now().UTC()
	switch wt.format {
	case "json", "yaml":
		e := event{Time: now, Event: kind, Key: s.Key, Holder: holder, Epoch: s.Epoch}
		if s.Held {
			e.ExpiresAt = tp(s.ExpiresAt)
		}
		var b []byte
		if wt.format == "json" {
			b, _ = json.Marshal(e)
			b = append(b, '\n')
		} else {
			y, _ := yaml.Marshal(e)
			b = append([]byte("---\n"), y...)
		}
		_, _ = wt.a.stdout.Write(b)
		return
	}
	h := "<none>"
	switch {
	case holder != "":
		h = quoteField(holder)
	case s.Status == statusFree, kind == "released", kind == "force_released":
		h = "<unknown>"
	}
	line := fmt.Sprintf("%s  %-14s %s  holder=%s epoch=%d", now.Format("15:04:05.000"), kind, quoteField(s.Key), h, s.Epoch)
	if s.Held {
		line += "  expires=" + stamp(s.ExpiresAt)
	}
	fmt.Fprintln(wt.a.stdout, line)
}

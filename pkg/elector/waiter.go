package elector

import (
	"context"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// LeaseWaiter adapts a *lease.Waiter (one LISTEN pg_lease connection shared
// by every waiter of the process) to the elector's Waiter: Wait subscribes
// to the key's notifications, then reads the key once through client (so a
// release committed before the subscription is not missed), and returns at
// the first release, force-release or resync, or at until. Acquisitions
// and renewals by the holder do not wake it: the elector then wakes at the
// expiry it observed, finds the grant renewed, and waits again.
func LeaseWaiter(w *lease.Waiter, client *lease.Client) Waiter {
	return leaseWaiter{w: w, client: client}
}

type leaseWaiter struct {
	w      *lease.Waiter
	client *lease.Client
}

func (lw leaseWaiter) Wait(ctx context.Context, key string, until time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	events := lw.w.Watch(wctx, key)
	if st, err := lw.client.Inspect(wctx, key); err == nil && !st.Held {
		return nil
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				// The watch ended: until passed, ctx ended, or the Waiter
				// was closed (the elector then polls).
				if err := ctx.Err(); err != nil {
					return err
				}
				if time.Now().Before(until) {
					return lease.ErrWaiterClosed
				}
				return nil
			}
			switch ev.Type {
			case lease.EventReleased, lease.EventForceReleased, lease.EventResync:
				return nil
			}
		case <-wctx.Done():
			return ctx.Err()
		}
	}
}

// Package listen is pg_lease's listener and its wake policy: code that waits
// for a key to change waits here.
//
// A Waiter is the process's one listener. It holds one dedicated connection
// that runs LISTEN pg_lease, makes it again after any loss, and fans the
// notifications (grants, releases, force-releases, handovers) out to Watch
// subscribers. It registers every key a subscriber waits for with
// lease.listen, so the server notifies changes of that key. Events are
// at-most-once: after a reconnection or a full channel a subscriber gets an
// EventResync and should read again.
//
// Changes (Subscribe) is the one wake loop: it waits for any of many keys
// to change (a notification, a resync) or to become free (WakeAt: the
// earliest expiry of the held ones, which sends no notification), or for a
// poll. Await waits until a key reaches a state: it reads the key, then
// reads again only when Changes wakes it. AwaitAcquire waits until an
// owner holds a key; the waiters of one Waiter send one acquire per
// wake-up between them. WaitOutGrace waits out the grace after a
// promotion, which ends without any notification.
//
//	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
//	if err != nil {
//		return err
//	}
//	defer w.Close()
//	st, err := listen.Await(ctx, w, client, "orders", 5*time.Second,
//		func(s lease.State) bool { return !s.Held })
package listen

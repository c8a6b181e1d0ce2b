// Package handover lets a release hand a key straight to a chosen follower.
// Followers register as candidates of a key; the strategy that the
// releasing database role set on the key says which ready candidate a
// release grants the key to, epoch + 1, in the release's own transaction,
// among the candidates of roles the releasing role may act as (its own, or
// a role it is a member of): another role's candidates and strategies never
// change where a role's release goes. Under StrategyAny (the default) the
// waiters race instead.
//
//	c := lease.New(pool)
//	_, err := handover.SetStrategy(ctx, c, "scheduler", handover.StrategyNewestVersion)
//	...
//	until, err := handover.Register(ctx, c, "scheduler", handover.Candidate{
//		Owner: "pod-b", Version: "1.31.0", Ready: true, TTL: 15 * time.Second,
//	})
//	// renew before until; the leader's Release now grants the key to pod-b
//
// Electors and locks take part through Candidacy (elector.Config,
// resourcelock's options), which keeps the registration renewed.
package handover

package shard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// Run holds the member key and the assigned shard keys until ctx ends, then
// stops every shard's work, releases the shards and the member key, and
// returns nil. It returns ErrIdentityTaken, holding nothing, when another
// live process holds this replica's member key.
func (r *Sharder) Run(ctx context.Context) error {
	clk := r.c.Clock()
	keys := []string{changedKey(r.cfg.Controller)}
	for s := range r.cfg.Shards {
		keys = append(keys, Key(r.cfg.Controller, s))
	}
	changes := listen.Subscribe(ctx, r.cfg.Waiter, clk, keys...)
	defer changes.Close()
	// A statement running when ctx ends runs to its end (a TTL at most): a
	// connection cut mid-statement would leave the releases a new one, and
	// the server finishes the statement anyway. The loops stop after it;
	// the leave does not wait for it (handOver).
	sctx, cancelStmts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStmts()
	stopGrace := context.AfterFunc(ctx, func() { clk.AfterFunc(r.cfg.TTL, cancelStmts) })
	defer stopGrace()
	// The leave begins at the stop, beside the statements running then:
	// the shards are handed over as soon as their work ended, and what
	// those statements take meanwhile is released at the end (finish).
	var out handedOff
	handing := make(chan struct{})
	startLeave := sync.OnceFunc(func() {
		stopped := clk.Now()
		go func() { defer close(handing); out = r.handOver(stopped) }()
	})
	stopLeave := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), errCrash) {
			startLeave()
		}
	})
	defer stopLeave()
	rctx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() { defer close(renewing); r.keep.Run(rctx) }()
	defer func() { stopRenewing(); <-renewing }()
	// Grants a release hands to this process are taken as their
	// notification arrives, beside the rounds (see takeHandedOver).
	tctx, cancelTaking := context.WithCancel(ctx)
	taking := make(chan struct{})
	if r.cfg.Waiter != nil {
		handovers := listen.Subscribe(tctx, r.cfg.Waiter, clk, keys[1:]...)
		go func() { defer close(taking); defer handovers.Close(); r.takeHandedOver(tctx, sctx, handovers) }()
	} else {
		close(taking)
	}
	stopTaking := func() { cancelTaking(); <-taking }
	defer stopTaking()
	// A crashed member's shards are taken at the lapse of its keys, as the
	// rounds planned, whatever statement a round is running then.
	octx, cancelOvers := context.WithCancel(ctx)
	overs := make(chan struct{})
	go func() { defer close(overs); r.sendTakeovers(octx, sctx) }()
	stopOvers := func() { cancelOvers(); <-overs }
	defer stopOvers()
	for {
		until, err := r.round(ctx, sctx)
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("shard: refusing to run", "controller", r.cfg.Controller,
				"identity", r.cfg.Identity, "err", err)
			stopLeave()
			startLeave()
			stopRenewing()
			<-renewing
			stopTaking()
			stopOvers()
			<-handing
			r.finish(out)
			return err
		}
		if _, err := changes.Wait(ctx, until, r.kick); err != nil {
			<-renewing
			stopTaking()
			stopOvers()
			if errors.Is(context.Cause(ctx), errCrash) {
				return nil // tests: a replica that stops renewing, as a crashed one
			}
			ended := clk.Now()
			<-handing
			out.loopsEnded = ended
			r.finish(out)
			return nil
		}
	}
}

// renewed is the keep-alive's report of one renewal: a failed one wakes
// the round, which stops lost shards and acquires the member key again.
func (r *Sharder) renewed(t *lease.Term, _ time.Duration, err error) {
	if err == nil {
		return
	}
	r.mu.Lock()
	leaving := r.leaving // a renewal running at the stop finds the keys released
	r.mu.Unlock()
	if !errors.Is(err, context.Canceled) && !leaving {
		r.cfg.Logger.Warn("shard: renewal", "key", t.Grant().Key, "err", err)
	}
	r.wake()
}

func (r *Sharder) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// errCrash, as the cause of Run's context, stops the loop without releasing
// anything: tests simulate a crashed replica with it.
var errCrash = errors.New("shard: crash")

// ErrIdentityTaken: another live process holds this replica's member key
// (two replicas were given one identity). Run returns it and holds nothing.
var ErrIdentityTaken = errors.New("shard: another live process holds this replica's member key")

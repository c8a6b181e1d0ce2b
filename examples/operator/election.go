package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/pglease/pg_lease/pkg/handover"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// election is how the manager elects its leader and where each reconcile
// gets its fencing token from.
type election struct {
	// newManager makes the manager, electing as this election does (the
	// timings are already set in the options).
	newManager func(*rest.Config, ctrl.Options) (manager.Manager, error)
	// fenced wraps the reconciler so that each Reconcile's context carries
	// the token of the current term.
	fenced func(reconcile.Reconciler) reconcile.Reconciler
	epoch  func() int64  // the epoch led under, 0 when none
	pool   *pgxpool.Pool // the lease database (-lock=pglease), for readiness
	close  func()
}

// pgleaseElection: a pg_lease key through pkg/resourcelock, plugged in by
// pkg/leaderelection. A term ends (and the contexts of the reconciles under it
// are cancelled) before its grant can expire on the server.
//
// With -leader-elect-handover the lock registers as a candidate of the key
// while it follows (ready when ready says so) and sets the key's strategy,
// so that the leader's release grants the key to the candidate it chooses.
func pgleaseElection(ctx context.Context, c config, ready func() bool) (*election, error) {
	pcfg, err := pgxpool.ParseConfig(c.leaseDSN)
	if err != nil {
		return nil, fmt.Errorf("lease database: %w", err)
	}
	// Warm each new connection: a handoff's first acquire and release then
	// cost what later ones do (no PL/pgSQL compile, no statement prepare).
	pcfg.AfterConnect = lease.WarmConn
	// Never acknowledge a change whose wait for the synchronous standbys was
	// cancelled (lease.ErrCommitUnknown).
	lease.ObserveCommits(&pcfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("lease database: %w", err)
	}
	// The process's one listener: a follower's Get waits on it, so that a
	// standby takes over within milliseconds of a release and at the
	// server's expiry of a crashed leader's grant.
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("lease database (listen connection): %w", err)
	}
	var cand *handover.Candidacy
	if c.handover != "" && c.handover != "any" {
		st, _ := handover.ParseStrategy(c.handover) // validated
		cand = &handover.Candidacy{Strategy: st, Version: c.version, Ready: ready}
	}
	lock, err := resourcelock.New(lease.New(pool), resourcelock.Config{
		Key: c.electionID, Identity: c.id,
		LeaseDuration: c.leaseDuration,
		Waiter:        w,
		Candidacy:     cand,
		OnEpochChange: func(old, new lease.Token) {
			if old.Epoch != 0 {
				emit(event{Event: "epoch-end", Epoch: old.Epoch})
			}
			if new.Epoch != 0 {
				emit(event{Event: "epoch-start", Epoch: new.Epoch})
			}
		},
	})
	if err != nil {
		_ = w.Close()
		pool.Close()
		return nil, err
	}
	return &election{
		newManager: func(cfg *rest.Config, o ctrl.Options) (manager.Manager, error) {
			// Release on cancel: a stopping leader frees the key (after
			// its term ended, cancelling every fenced reconcile), so that
			// its successor takes over at once instead of after the TTL.
			o.LeaderElectionReleaseOnCancel = true
			return pgle.NewManagerForLock(cfg, o, lock)
		},
		fenced: func(r reconcile.Reconciler) reconcile.Reconciler {
			return pgle.Fenced(lock, r)
		},
		epoch: func() int64 { t, _ := lock.Token(); return t.Epoch },
		pool:  pool,
		close: func() { closeWithin(func() { _ = w.Close() }); closeSoon(pool) },
	}, nil
}

// leaseElection: client-go's own coordination.k8s.io Lease, for comparison.
// Its epoch is the Lease's leaseTransitions+1, which client-go raises at
// every change of holder (a release included), so it orders the terms as
// the Lease's resourceVersions do. Unlike a pg_lease term, nothing ends such
// a term locally before the Lease expires: a paused leader's token stays in
// use until the manager gives up (RenewDeadline) and the process exits; the
// store's guard still rejects its writes once a successor has written.
func leaseElection(cfg *rest.Config, c config) (*election, error) {
	cs, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	l := &leaseTerms{
		Interface: &rl.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: c.namespace, Name: c.electionID},
			Client:     cs,
			LockConfig: rl.ResourceLockConfig{Identity: c.id},
		},
		key: c.namespace + "/" + c.electionID,
	}
	return &election{
		newManager: func(cfg *rest.Config, o ctrl.Options) (manager.Manager, error) {
			o.LeaderElection = true
			o.LeaderElectionResourceLockInterface = l
			o.LeaderElectionReleaseOnCancel = true
			return ctrl.NewManager(cfg, o)
		},
		fenced: func(r reconcile.Reconciler) reconcile.Reconciler {
			return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				tok, ok := l.token()
				if !ok {
					return reconcile.Result{}, fmt.Errorf("%s: this process holds no term", l.key)
				}
				return r.Reconcile(lease.ContextWithToken(ctx, tok), req)
			})
		},
		epoch: func() int64 { tok, _ := l.token(); return tok.Epoch },
		close: func() {},
	}, nil
}

// leaseTerms wraps a client-go lock and follows the terms it obtains: a
// successful Create or Update with its own identity at a new
// leaseTransitions starts one, a release ends it.
type leaseTerms struct {
	rl.Interface
	key   string
	mu    sync.Mutex
	epoch int64
}

func (l *leaseTerms) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	if err == nil && ler.HolderIdentity == l.Identity() {
		l.held(int64(ler.LeaderTransitions) + 1)
	}
	return err
}

func (l *leaseTerms) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		l.held(0) // release: stop handing out the token before the Lease is freed
	}
	err := l.Interface.Update(ctx, ler)
	if err == nil && ler.HolderIdentity == l.Identity() {
		l.held(int64(ler.LeaderTransitions) + 1)
	}
	return err
}

// held records the epoch now held (0: none) and reports a change.
func (l *leaseTerms) held(epoch int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if epoch == l.epoch {
		return
	}
	if l.epoch != 0 {
		emit(event{Event: "epoch-end", Epoch: l.epoch})
	}
	l.epoch = epoch
	if epoch != 0 {
		emit(event{Event: "epoch-start", Epoch: epoch})
	}
}

func (l *leaseTerms) token() (lease.Token, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return lease.Token{Key: l.key, Owner: l.Identity(), Epoch: l.epoch}, l.epoch != 0
}

package resourcelock

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/leaderelection"
)

// LeaderElectionConfig checks, and completes, a client-go
// LeaderElectionConfig for this lock: it sets Lock when nil, fills zero
// timings in client-go's default proportions of the lock's lease duration
// (15s/10s/2s for 15s: LeaseDuration = the lock's, RenewDeadline = 2/3 of
// it, RetryPeriod = 2/15 of it), and returns an error naming every offending
// field:
//
//   - client-go's own rules, which NewLeaderElector enforces and RunOrDie
//     panics on: LeaseDuration > RenewDeadline > JitterFactor × RetryPeriod > 0;
//   - RenewDeadline + RetryPeriod below the lock's lease duration minus its
//     margin. client-go's leader context ends only after a renewal round of
//     RenewDeadline, which starts RetryPeriod after the last success, has
//     failed: with a longer sum, that context outlives the grant on the
//     server and overlaps the successor's term;
//   - Lock, when set, must be this lock.
//
// client-go's LeaseDuration only times followers (the server decides every
// expiry with the lock's own lease duration), so it may differ from the
// lock's; zero takes the lock's.
func (l *Lock) LeaderElectionConfig(cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, error) {
	ttl := l.opts.leaseDuration
	var errs []error
	switch {
	case cfg.Lock == nil:
		cfg.Lock = l
	case cfg.Lock != l:
		errs = append(errs, fmt.Errorf("Lock: is %s, not this lock (%s)", cfg.Lock.Describe(), l.Describe()))
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = ttl
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = ttl * 2 / 3
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = ttl * 2 / 15
	}
	if cfg.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("RetryPeriod (%v) must be positive", cfg.RetryPeriod))
	}
	if jit := time.Duration(leaderelection.JitterFactor * float64(cfg.RetryPeriod)); cfg.RenewDeadline <= jit {
		errs = append(errs, fmt.Errorf("RenewDeadline (%v) must be greater than RetryPeriod (%v) x JitterFactor %v = %v",
			cfg.RenewDeadline, cfg.RetryPeriod, leaderelection.JitterFactor, jit))
	}
	if cfg.LeaseDuration <= cfg.RenewDeadline {
		errs = append(errs, fmt.Errorf("LeaseDuration (%v) must be greater than RenewDeadline (%v)", cfg.LeaseDuration, cfg.RenewDeadline))
	}
	if limit := ttl - l.opts.margin; cfg.RenewDeadline+cfg.RetryPeriod >= limit {
		errs = append(errs, fmt.Errorf("RenewDeadline (%v) + RetryPeriod (%v) = %v must be below the lock's lease duration (%v) minus its margin (%v) = %v: "+
			"client-go's leader context would outlive the grant", cfg.RenewDeadline, cfg.RetryPeriod,
			cfg.RenewDeadline+cfg.RetryPeriod, ttl, l.opts.margin, limit))
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("resourcelock: LeaderElectionConfig for %s: %w", l.Describe(), errors.Join(errs...))
	}
	return cfg, nil
}

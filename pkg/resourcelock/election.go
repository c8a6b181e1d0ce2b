package resourcelock

import (
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"k8s.io/client-go/tools/leaderelection"
)

// LeaderElectionConfig checks, and completes, a client-go
// LeaderElectionConfig for this lock. It sets Lock when nil; a Lock that is
// set must be this lock. The timings follow Timing with the lock's lease
// duration and margin. The error names every offending field.
func (l *Lock) LeaderElectionConfig(cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, error) {
	var errs []error
	switch {
	case cfg.Lock == nil:
		cfg.Lock = l
	case cfg.Lock != l:
		errs = append(errs, fmt.Errorf("Lock: is %s, not this lock (%s)", cfg.Lock.Describe(), l.Describe()))
	}
	cfg, err := Timing(l.opts.LeaseDuration, l.opts.Margin, cfg)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("resourcelock: LeaderElectionConfig for %s: %w", l.Describe(), errors.Join(errs...))
	}
	return cfg, nil
}

// Timing is the timing rule of every pg_lease lock, for a lock whose lease
// duration (the TTL sent to the server) is ttl and whose margin is margin
// (0: lease.CheckMargin's default). It is a pure function: the lock, the
// manager glue and the configuration checks of package leaderelection all
// call it. It fills zero timings of cfg in client-go's proportions of ttl:
// LeaseDuration = ttl, RenewDeadline = 2/3 and RetryPeriod = 2/15 of it
// (15s/10s/2s for 15s). It returns an error naming every offending field:
//
//   - the TTL or margin that lease.CheckMargin refuses (the error then
//     matches lease.ErrInvalidInput, and nothing else is checked);
//   - client-go's own rules, which NewLeaderElector enforces and RunOrDie
//     panics on: LeaseDuration > RenewDeadline > JitterFactor × RetryPeriod > 0;
//   - RenewDeadline + RetryPeriod below ttl minus the margin. client-go's
//     leader context ends only after a renewal round of RenewDeadline has
//     failed, and that round starts RetryPeriod after the last success.
//     With a longer sum the context outlives the grant on the server.
//
// client-go's LeaseDuration only times followers (the server decides every
// expiry with ttl), so it may differ from ttl. cfg.Lock is not looked at.
func Timing(ttl, margin time.Duration, cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, error) {
	margin, err := checkTTL(ttl, margin)
	if err != nil {
		return cfg, err
	}
	var errs []error
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
	if limit := ttl - margin; cfg.RenewDeadline+cfg.RetryPeriod >= limit {
		errs = append(errs, fmt.Errorf("RenewDeadline (%v) + RetryPeriod (%v) = %v must be below the lock's lease duration (%v) minus its margin (%v) = %v: "+
			"client-go's leader context would outlive the grant", cfg.RenewDeadline, cfg.RetryPeriod,
			cfg.RenewDeadline+cfg.RetryPeriod, ttl, margin, limit))
	}
	return cfg, errors.Join(errs...)
}

// checkTTL applies lease.CheckMargin to a lock's lease duration and margin
// (0: the default) and returns the margin to use. Its error names the
// field, LeaseDuration or Margin, and matches lease.ErrInvalidInput.
func checkTTL(ttl, margin time.Duration) (time.Duration, error) {
	m, err := lease.CheckMargin(ttl, margin)
	if err == nil {
		return m, nil
	}
	if _, terr := lease.CheckMargin(ttl, 0); terr != nil {
		return 0, fmt.Errorf("LeaseDuration: %w", terr)
	}
	return 0, fmt.Errorf("Margin: %w", err)
}

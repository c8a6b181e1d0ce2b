package resourcelock

import (
	"fmt"
	"net/http"
	"time"
)

// touch records that the elector called the lock (Get, Create or Update).
func (l *Lock) touch() {
	l.mu.Lock()
	l.lastCall = l.client.Clock().Now()
	l.mu.Unlock()
}

// Check is a health check in controller-runtime's healthz.Checker shape
// (mgr.AddHealthzCheck("leader-election", lock.Check)), like client-go's
// HealthzAdaptor: it fails when this lock still holds a grant but the elector
// has not called it (renew, or any Get/Update) for more than twice the lease
// duration. A live client-go elector calls its lock every RetryPeriod, so
// that only happens when the elector is stuck while the process may still
// act as leader; restarting the process ends that, and the server's expiry
// hands the lease on in any case.
func (l *Lock) Check(_ *http.Request) error {
	l.mu.Lock()
	t, last := l.term, l.lastCall
	l.mu.Unlock()
	if t == nil {
		return nil
	}
	if idle := l.client.Clock().Since(last); idle > 2*l.cfg.LeaseDuration {
		return fmt.Errorf("resourcelock %s: holding epoch %d but the elector has not called the lock for %v (> 2 x lease duration %v)",
			l.cfg.Key, t.Grant().Epoch, idle.Round(time.Millisecond), l.cfg.LeaseDuration)
	}
	return nil
}

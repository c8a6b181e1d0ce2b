package lease

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// The timing rules of the package, each in one place. roundTrip is the local
// view of a server instant. CheckMargin is the margin of a term.
// Client.WithClock sets the clock everything reads.

// Margin rule. A term ends Margin before its grant's ValidUntil. The margin
// covers two things. The first is the rate difference between this
// process's monotonic clock and the server's clock over one grant: the drift
// floor, below which no margin is accepted. The second is the delay between
// the local deadline and the moment code acting under the term sees its end:
// timer latency, scheduling on a loaded host, a GC pause, a write in flight.
const (
	// maxClockRateDrift is the relative rate difference the drift floor
	// covers: 1000 ppm, twice what NTP (and chrony by default) may slew a
	// clock, far above a quartz oscillator's tens of ppm. Over a TTL it is
	// TTL/1000.
	maxClockRateDrift = 1e-3
	// schedulingMargin is the fixed part of the default margin.
	schedulingMargin = 100 * time.Millisecond
	// minTermTTL is the smallest TTL a term accepts: its margin must fit in
	// a third of it with room for a renewal.
	minTermTTL = 3 * time.Millisecond
)

// driftFloor is the clock-rate drift over one grant of ttl, rounded up to a
// microsecond.
func driftFloor(ttl time.Duration) time.Duration {
	d := time.Duration(float64(ttl) * maxClockRateDrift)
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}

// CheckMargin is the margin rule of every term. It returns the margin to use
// for grants of ttl. Margin 0 asks for the default, min(ttl/3, 100ms +
// ttl/1000). The error matches ErrInvalidInput when ttl is below 3ms, or
// when margin is below the clock-rate drift floor (ttl/1000, 1000 ppm) or
// above ttl/3. pkg/elector, pkg/resourcelock and pglease lock use it.
func CheckMargin(ttl, margin time.Duration) (time.Duration, error) {
	if ttl < minTermTTL {
		return 0, fmt.Errorf("%w: ttl must be at least %v for a term, got %v", ErrInvalidInput, minTermTTL, ttl)
	}
	floor := driftFloor(ttl)
	if margin == 0 {
		margin = min(ttl/3, schedulingMargin+floor)
	}
	if margin < floor || margin > ttl/3 {
		return 0, fmt.Errorf("%w: margin must be at least ttl*1e-3 (%v, clock-rate drift over one grant) and at most ttl/3 (%v), got %v",
			ErrInvalidInput, floor, ttl/3, margin)
	}
	return margin, nil
}

// roundTrip is one request's round trip on the local clock, with the
// server's clock read during it (clock_timestamp() in the same statement).
// It is the one formula by which the package turns a server instant into a
// local one. The server read serverNow somewhere between sent and received.
// So, clock rates being equal, the server's clock shows x at a local instant
// within [earliest(x), latest(x)].
type roundTrip struct {
	sent, received, serverNow time.Time
}

// earliest is the first local instant at which the server's clock can show
// x: a holder's grant is certainly held until earliest(expires_at)
// (Grant.ValidUntil).
func (r roundTrip) earliest(x time.Time) time.Time { return r.sent.Add(x.Sub(r.serverNow)) }

// latest is the last local instant at which the server's clock can still
// be before x: a follower knows a grant has expired on the server by
// latest(expires_at) (State.ExpiresLocal).
func (r roundTrip) latest(x time.Time) time.Time { return r.received.Add(x.Sub(r.serverNow)) }

// realClock is the clock of a Client made by New.
var realClock clock.WithDelayedExecution = clock.RealClock{}

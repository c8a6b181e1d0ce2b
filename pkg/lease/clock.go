package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ClockOffset relates the server's clock to this process's, from one round
// trip: the server read its clock (clock_timestamp()) somewhere between the
// request's send and the reply's receipt, so the true offset lies within
// ±RTT/2 of Offset.
type ClockOffset struct {
	// Local is the midpoint of the round trip on this process's clock. It
	// carries a monotonic reading, so ToLocal is immune to local wall-clock
	// steps.
	Local time.Time
	// Server is the server's clock read during the round trip.
	Server time.Time
	// RTT is the round trip's duration: the measurement's uncertainty is
	// RTT/2 either way.
	RTT time.Duration
}

// Offset is the server's clock minus the local wall clock (positive when
// the server is ahead).
func (o ClockOffset) Offset() time.Duration { return o.Server.Sub(o.Local.Round(0)) }

// ToLocal converts an instant on the server's clock to the local instant at
// which the server's clock shows it, on the monotonic clock (clock rates
// being equal). The error is at most RTT/2 either way.
func (o ClockOffset) ToLocal(server time.Time) time.Time { return o.Local.Add(server.Sub(o.Server)) }

// IsZero reports whether o was never measured.
func (o ClockOffset) IsZero() bool { return o.Local.IsZero() }

// MeasureClockOffset measures the server clock's offset: samples round trips
// of SELECT clock_timestamp(), keeping the one with the shortest round trip
// (the tightest bound). samples below 1 count as 1.
func MeasureClockOffset(ctx context.Context, q Querier, samples int) (ClockOffset, error) {
	if samples < 1 {
		samples = 1
	}
	var best ClockOffset
	for i := 0; i < samples; i++ {
		var server time.Time
		t0 := time.Now()
		if err := q.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&server); err != nil {
			return ClockOffset{}, fmt.Errorf("lease: measuring the server clock: %w", err)
		}
		t1 := time.Now()
		rtt := t1.Sub(t0)
		if best.IsZero() || rtt < best.RTT {
			best = ClockOffset{Local: t0.Add(rtt / 2), Server: server, RTT: rtt}
		}
	}
	if best.IsZero() {
		return ClockOffset{}, errors.New("lease: measuring the server clock: no sample")
	}
	return best, nil
}

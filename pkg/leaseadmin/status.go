package leaseadmin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Settings is the database's pg_lease configuration and the timeline state
// that grant paths and renewals recorded (lease.status, every role).
type Settings struct {
	// MaxTTL is the largest TTL acquire and renew accept.
	MaxTTL time.Duration
	// Promotion is the promotion mode: "any" (a grace of MaxTTL after a
	// promotion) or "synchronous" (no grace; pg_lease 0.4.0).
	Promotion string
	// PromotionGrace is the grace a promotion seen now would impose.
	PromotionGrace time.Duration
	// Timeline and Era are the WAL timeline last recorded and its epoch era.
	Timeline, Era int64
	// GraceUntil is when the grace of the last recorded promotion ends
	// (server clock; zero when none was ever recorded). No new grant is
	// made before it.
	GraceUntil time.Time
	// EpochFloor is the floor lease.cleanup raised.
	EpochFloor int64
	// ServerNow is the server's clock when the settings were read.
	ServerNow time.Time
}

// GraceLeft is how much of the last promotion's grace was left when the
// settings were read (0 when none is in force).
func (s Settings) GraceLeft() time.Duration {
	if s.GraceUntil.IsZero() || !s.GraceUntil.After(s.ServerNow) {
		return 0
	}
	return s.GraceUntil.Sub(s.ServerNow)
}

// ReadSettings reads lease.status() through c. It works on a standby too
// (the recorded state may then lag the primary's).
func ReadSettings(ctx context.Context, c *lease.Client) (Settings, error) {
	var (
		raw           []byte
		s             Settings
		maxTTL, grace float64
	)
	// to_jsonb: the columns of every SQL version (promotion is 0.4.0's).
	err := c.Querier().QueryRow(ctx, `SELECT to_jsonb(s), extract(epoch FROM s.max_ttl)::float8,
	    extract(epoch FROM s.promotion_grace)::float8, clock_timestamp() FROM lease.status() s`).
		Scan(&raw, &maxTTL, &grace, &s.ServerNow)
	if err != nil {
		return Settings{}, lease.WrapError("status", "", err)
	}
	var row struct {
		Timeline   *int64     `json:"timeline"`
		Era        *int64     `json:"era"`
		GraceUntil *time.Time `json:"grace_until"`
		EpochFloor int64      `json:"epoch_floor"`
		Promotion  *string    `json:"promotion"`
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return Settings{}, fmt.Errorf("status: %w", err)
	}
	s.MaxTTL = time.Duration(maxTTL * float64(time.Second))
	s.PromotionGrace = time.Duration(grace * float64(time.Second))
	s.Promotion = "any"
	if row.Promotion != nil {
		s.Promotion = *row.Promotion
	}
	if row.Timeline != nil {
		s.Timeline = *row.Timeline
	}
	if row.Era != nil {
		s.Era = *row.Era
	}
	if row.GraceUntil != nil {
		s.GraceUntil = *row.GraceUntil
	}
	s.EpochFloor = row.EpochFloor
	return s, nil
}

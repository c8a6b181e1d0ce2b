package leaseadmin

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Kinds of HistoryEvent (the event column of lease.history).
const (
	// HistoryAcquired: a grant of a key that was free (released, never
	// leased, or removed by clean-up).
	HistoryAcquired = "acquired"
	// HistoryTakenOver: a grant of a key whose previous grant lapsed without
	// a release; PreviousOwner and PreviousEpoch name that grant.
	HistoryTakenOver = "taken_over"
	// HistoryReleased: the holder released its grant.
	HistoryReleased = "released"
	// HistoryForceReleased: an operator ended the grant (lease.force_release);
	// Actor is the operator's role.
	HistoryForceReleased = "force_released"
	// HistoryPromotionGrace: the grant that follows was withheld by the grace
	// after a timeline change (a promotion); Detail says until when.
	HistoryPromotionGrace = "promotion_grace"
)

// HistoryEvent is one recorded change of a key's leadership (lease.history).
type HistoryEvent struct {
	Key string
	// Seq numbers the key's events from 1 in order. Retention removes each
	// role's oldest events of the key (pg_lease 0.5.0: per role that made
	// them), so the kept ones may have gaps.
	Seq int64
	// At is the server's clock when the change was made.
	At   time.Time
	Kind string
	// Owner, Role and Epoch are the grant the event concerns: the new
	// grant (acquired, taken_over) or the one that ended (released,
	// force_released). Role is the database role bound to the grant.
	// From pg_lease 0.5.0 Role and Actor are empty unless the caller's
	// role is that role or a member of it.
	Owner string
	Role  string
	Epoch int64
	// Actor is the database role (session_user) whose call made the change.
	Actor string
	// PreviousOwner and PreviousEpoch: the lapsed grant a takeover ended.
	PreviousOwner string
	PreviousEpoch int64
	// VacantSince: for a grant, when the key was last held (the end of the
	// previous grant); zero for a key's first grant.
	VacantSince time.Time
	// TTL is the duration a grant was made for (zero for other kinds).
	TTL    time.Duration
	Detail string
}

// History returns the last (at most limit, 1 to 10000) recorded events of
// key through c, oldest first, whichever roles made them. A key without
// history gives none. Every role that may call lease.inspect may read it;
// role names are shown only to their roles and members.
func History(ctx context.Context, c *lease.Client, key string, limit int) ([]HistoryEvent, error) {
	if limit < 1 || limit > 10000 {
		return nil, fmt.Errorf("history %q: %w: limit %d must be between 1 and 10000", key, lease.ErrInvalidInput, limit)
	}
	rows, err := c.Querier().Query(ctx, `
SELECT h.seq, h.at, h.event, h.owner, h.holder_role, h.epoch, h.actor, h.previous_owner,
       h.previous_epoch, h.vacant_since, extract(epoch FROM h.ttl)::float8, h.detail
  FROM lease.history($1, $2) h`, key, limit)
	if err != nil {
		return nil, lease.WrapError("history", key, err)
	}
	defer rows.Close()
	var out []HistoryEvent
	for rows.Next() {
		e := HistoryEvent{Key: key}
		var (
			owner, role, actor, prevOwner, detail *string
			epoch, prevEpoch                      *int64
			vacant                                *time.Time
			ttl                                   *float64
		)
		if err := rows.Scan(&e.Seq, &e.At, &e.Kind, &owner, &role, &epoch, &actor, &prevOwner,
			&prevEpoch, &vacant, &ttl, &detail); err != nil {
			return nil, lease.WrapError("history", key, err)
		}
		e.Owner, e.Role, e.Actor, e.PreviousOwner, e.Detail = str(owner), str(role), str(actor), str(prevOwner), str(detail)
		e.Epoch, e.PreviousEpoch = i64(epoch), i64(prevEpoch)
		if vacant != nil {
			e.VacantSince = *vacant
		}
		e.TTL = seconds(ttl)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, lease.WrapError("history", key, err)
	}
	return out, nil
}

// KeyHealth is one key's leadership over a recent period (lease.health).
type KeyHealth struct {
	Key  string
	Held bool
	// Owner, Role, TermStarted and ExpiresAt describe the current grant
	// (zero when not held); TermAge is how long it has lasted. From
	// pg_lease 0.5.0 Role is empty unless the caller's role is the grant's
	// role or a member of it.
	Owner       string
	Role        string
	Epoch       int64
	TermStarted time.Time
	ExpiresAt   time.Time
	TermAge     time.Duration
	// VacantSince is when the key was last held (zero when held); Vacant
	// is how long it has had no holder.
	VacantSince time.Time
	Vacant      time.Duration
	// TTL is the duration of the current or last grant, from the history
	// (zero when unknown).
	TTL time.Duration
	// Grants counts the grants recorded for the key since its history
	// began (a counter: it only grows, unless clean-up removes the key).
	// HasHistory is false when nothing was recorded for the key.
	Grants     int64
	HasHistory bool
	// Transitions counts the grants in the period; Leaderless is how long
	// within the period the key had no holder. Both see only the history
	// kept: HistorySince is since when it is complete, the oldest event
	// kept or, when later, the newest event retention removed (zero: none).
	Transitions  int64
	Leaderless   time.Duration
	HistorySince time.Time
	// Period is the period asked for, ServerNow the server's clock at the
	// read.
	Period    time.Duration
	ServerNow time.Time
}

// Health returns every key's health over the last period (1 second to 366
// days) through c, ordered by key.
func Health(ctx context.Context, c *lease.Client, period time.Duration) ([]KeyHealth, error) {
	if period < time.Second || period > 366*24*time.Hour {
		return nil, fmt.Errorf("health: %w: period %v must be between 1s and 366 days", lease.ErrInvalidInput, period)
	}
	rows, err := c.Querier().Query(ctx, `
SELECT h.key, h.held, h.owner, h.holder_role, h.epoch, h.term_started, h.expires_at, h.vacant_since,
       extract(epoch FROM h.ttl)::float8, h.grants, h.transitions, h.leaderless_seconds,
       h.history_since, h.observed_at
  FROM lease.health(make_interval(secs => $1)) h`, period.Seconds())
	if err != nil {
		return nil, lease.WrapError("health", "", err)
	}
	defer rows.Close()
	var out []KeyHealth
	for rows.Next() {
		h := KeyHealth{Period: period}
		var (
			owner, role                        *string
			started, expires, vacant, histFrom *time.Time
			ttl, leaderless                    *float64
			grants, transitions                *int64
		)
		if err := rows.Scan(&h.Key, &h.Held, &owner, &role, &h.Epoch, &started, &expires, &vacant,
			&ttl, &grants, &transitions, &leaderless, &histFrom, &h.ServerNow); err != nil {
			return nil, lease.WrapError("health", "", err)
		}
		h.Owner, h.Role = str(owner), str(role)
		if started != nil {
			h.TermStarted = *started
			h.TermAge = max(0, h.ServerNow.Sub(*started))
		}
		if expires != nil {
			h.ExpiresAt = *expires
		}
		if vacant != nil {
			h.VacantSince = *vacant
			h.Vacant = max(0, h.ServerNow.Sub(*vacant))
		}
		h.TTL = seconds(ttl)
		h.HasHistory = grants != nil
		h.Grants, h.Transitions = i64(grants), i64(transitions)
		h.Leaderless = seconds(leaderless)
		if histFrom != nil {
			h.HistorySince = *histFrom
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, lease.WrapError("health", "", err)
	}
	return out, nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func i64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// seconds converts a number of seconds from the server to a Duration,
// rounded to the microsecond (the server's resolution); nil gives 0.
func seconds(p *float64) time.Duration {
	if p == nil || math.IsNaN(*p) {
		return 0
	}
	s := math.Min(*p, math.MaxInt64/float64(time.Second))
	return time.Duration(math.Round(s*1e6)) * time.Microsecond
}

package main

import (
	"context"
	"fmt"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Statuses of a key.
const (
	statusHeld     = "held"     // granted and not expired
	statusLapsed   = "lapsed"   // the grant expired without a release; HOLDER is its holder
	statusReleased = "released" // released by its holder or by release --force
	statusFree     = "free"     // not held; a server before pg_lease 0.4.0 does not say why
)

// keyState is a key as pglease shows it: lease.State and what it says about
// a key that is not held.
type keyState struct {
	lease.State
	Status string
	// Holder is the current holder (held) or the holder whose grant lapsed.
	Holder string
}

func newKeyState(s lease.State) keyState {
	k := keyState{State: s, Status: statusFree}
	switch {
	case s.Held:
		k.Status, k.Holder = statusHeld, s.Owner
	case s.Lapsed:
		k.Status, k.Holder = statusLapsed, s.LastOwner
		// The lapsed grant's expiry, as get -o json shows it.
		k.ExpiresAt = s.Since
	case s.Released:
		k.Status = statusReleased
	}
	return k
}

// readStates returns the states of keys (every key when keys is nil) that
// have a row, in key order (lease.list).
func readStates(ctx context.Context, q lease.Querier, keys []string) ([]keyState, error) {
	states, err := lease.New(q).List(ctx, keys...)
	if err != nil {
		return nil, err
	}
	out := make([]keyState, 0, len(states))
	for _, s := range states {
		out = append(out, newKeyState(s))
	}
	return out, nil
}

// checkKey applies the server's key rule (lease.CheckKey) before anything
// is sent, naming the key.
func checkKey(k string) error {
	if err := lease.CheckKey(k); err != nil {
		return fmt.Errorf("invalid key %s: %w", quoteField(truncate(k, 64)), err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

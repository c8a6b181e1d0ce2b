package failover

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// grantRec is one acknowledged grant: acquire returned acquired = true.
type grantRec struct {
	key, owner string
	epoch      int64
	inv, resp  time.Time // call and return, on this process's monotonic clock
}

// history collects grants from concurrent clients.
type history = pgtest.Log[grantRec]

// checkGrants returns the violations of: (1) no (key, epoch) is granted to
// two owners; (2) per key, a grant acknowledged before another was asked
// for has a lower epoch (epochs strictly increase over the real-time order
// of the whole history; an idempotent re-acquire of the same grant, same
// owner and epoch, is the same grant).
func checkGrants(gs []grantRec) []string {
	var v []string
	owners := map[string]map[string]bool{}
	byKey := map[string][]grantRec{}
	for _, g := range gs {
		ke := fmt.Sprintf("%s/%d", g.key, g.epoch)
		if owners[ke] == nil {
			owners[ke] = map[string]bool{}
		}
		owners[ke][g.owner] = true
		byKey[g.key] = append(byKey[g.key], g)
	}
	keys := make([]string, 0, len(owners))
	for ke := range owners {
		keys = append(keys, ke)
	}
	sort.Strings(keys)
	for _, ke := range keys {
		if len(owners[ke]) > 1 {
			var os []string
			for o := range owners[ke] {
				os = append(os, o)
			}
			sort.Strings(os)
			v = append(v, fmt.Sprintf("key/epoch %s granted to %d owners: %s", ke, len(os), strings.Join(os, ", ")))
		}
	}
	for key, all := range byKey {
		sort.Slice(all, func(i, j int) bool { return all[i].resp.Before(all[j].resp) })
		// One record per grant: its first acknowledgment.
		var list []grantRec
		seen := map[string]bool{}
		for _, g := range all {
			id := fmt.Sprintf("%s/%d", g.owner, g.epoch)
			if !seen[id] {
				seen[id] = true
				list = append(list, g)
			}
		}
		for i, a := range list {
			for _, b := range list[i+1:] {
				if !a.resp.Before(b.inv) {
					continue // concurrent calls: no real-time order
				}
				if a.epoch == b.epoch && a.owner == b.owner {
					continue // the same grant again
				}
				if b.epoch <= a.epoch {
					v = append(v, fmt.Sprintf("key %s: epoch %d (%s) granted after epoch %d (%s) was acknowledged", key, b.epoch, b.owner, a.epoch, a.owner))
				}
			}
		}
	}
	sort.Strings(v)
	return v
}

// report fails t with the violations, at most 20 of them spelled out.
func report(t interface {
	Errorf(string, ...any)
}, v []string) {
	if len(v) == 0 {
		return
	}
	shown := v
	if len(shown) > 20 {
		shown = shown[:20]
	}
	t.Errorf("%d violations:\n%s", len(v), strings.Join(shown, "\n"))
}

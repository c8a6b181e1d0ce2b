package resourcelock

// The leader election record the lock shows client-go, and its raw bytes.

import (
	"encoding/json"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// rawRecord is what Get's raw bytes encode: the facts a holder's write
// changes and nothing computed at read time.
type rawRecord struct {
	Key    string `json:"key"`
	Epoch  int64  `json:"epoch"`
	Holder string `json:"holder"`
	// ExpiresAt is the server's expiry written by the last grant or renewal
	// of Epoch (UTC); absent when the key is free.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

func (l *Lock) heldRecord(g lease.Grant) rawRecord {
	exp := g.ExpiresAt.UTC()
	return rawRecord{Key: l.cfg.Key, Epoch: g.Epoch, Holder: l.cfg.Identity, ExpiresAt: &exp}
}

func (l *Lock) record(r rawRecord) (*rl.LeaderElectionRecord, []byte, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	secs := int((l.cfg.LeaseDuration + time.Second - 1) / time.Second)
	return &rl.LeaderElectionRecord{
		HolderIdentity:       r.Holder,
		LeaseDurationSeconds: secs,
		LeaderTransitions:    int(r.Epoch),
	}, raw, nil
}

// TakenSuffix is appended to the lock's identity in the record of a key
// held under that identity by another session (another database role):
// the HolderIdentity client-go sees is then not its own.
const TakenSuffix = " (held by another session)"

// recordOf is the record of state s. A held key names its holder, epoch and
// server expiry; a grant under this lock's identity that the server said is
// another session's names the identity with TakenSuffix. A free key names
// only its epoch, whether it was released or lapsed: a lapse the server
// decided is a change like a release. A key that does not exist is the zero
// record.
func (l *Lock) recordOf(s lease.State) rawRecord {
	holder := s.Owner
	if s.Held && s.Owner == l.cfg.Identity {
		l.mu.Lock()
		if s.Epoch == l.notMine {
			holder += TakenSuffix
		}
		l.mu.Unlock()
	}
	switch {
	case !s.Exists:
		return rawRecord{}
	case s.Held && s.ExpiresAt.IsZero():
		// No expiry read: none is named.
		return rawRecord{Key: l.cfg.Key, Epoch: s.Epoch, Holder: holder}
	case s.Held:
		exp := s.ExpiresAt.UTC()
		return rawRecord{Key: l.cfg.Key, Epoch: s.Epoch, Holder: holder, ExpiresAt: &exp}
	default:
		return rawRecord{Key: l.cfg.Key, Epoch: s.Epoch}
	}
}

package resourcelock

import (
	"fmt"
	"strings"
	"sync"

	"github.com/pglease/pg_lease/pkg/lease"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// RecordEvent records a client-go leader election event ("became leader",
// "stopped leading") on the lock's event recorder. The message names the
// identity and the epoch held when it is recorded.
//
// "stopped leading" (client-go's elector sends it when its leadership
// ends, whatever ended it) also ends the live term, with
// ErrStoppedLeading: a renewal that failed for RenewDeadline ends
// client-go's leadership while the grant may still be valid, and the next
// leadership of this identity must not resume the same epoch (what acted
// under the old leadership may still be in flight). The next Update gives
// the grant back; the one after acquires a new epoch.
func (l *Lock) RecordEvent(s string) {
	defer func() {
		if s == stoppedLeading {
			if t := l.liveTerm(); t != nil {
				// Past its deadline, a term ends with the deadline, as
				// however else the lock notices it (lose).
				cause := ErrStoppedLeading
				if !l.client.Clock().Now().Before(t.Deadline()) {
					cause = lease.ErrLocalDeadline
				}
				t.End(cause)
			}
		}
	}()
	ev := l.events
	ev.mu.Lock()
	r, obj := ev.recorder, ev.object
	ev.mu.Unlock()
	if r == nil {
		return
	}
	msg := l.cfg.Identity + " " + s
	if t := l.liveTerm(); t != nil {
		msg = fmt.Sprintf("%s (epoch %d)", msg, t.Grant().Epoch)
	}
	r.Eventf(obj, corev1.EventTypeNormal, "LeaderElection", "%s", msg)
}

// stoppedLeading is the event client-go's elector records when its
// leadership ends (tools/leaderelection, LeaderElector.renew).
const stoppedLeading = "stopped leading"

// SetEventRecorder makes RecordEvent record on r from now on, in place of
// Config.EventRecorder: for a recorder that exists only once the lock is
// built, such as a controller-runtime manager's. A key without a namespace
// part names its Lease in namespace.
func (l *Lock) SetEventRecorder(r rl.EventRecorder, namespace string) {
	ev := l.events
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.recorder = r
	if !ev.given {
		ev.object = eventLease(l.cfg.Key, namespace)
	}
}

// events is where RecordEvent records, and about what.
type events struct {
	mu       sync.Mutex
	recorder rl.EventRecorder
	object   runtime.Object
	given    bool // object came from Config.EventObject
}

// eventLease is the object the lock's events are about: the
// coordination.k8s.io/v1 Lease named after the key. A "namespace/name" key
// is split; any other key is a name in namespace.
func eventLease(key, namespace string) *coordinationv1.Lease {
	name := key
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		namespace, name = key[:i], key[i+1:]
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	l.Kind = "Lease"
	l.APIVersion = coordinationv1.SchemeGroupVersion.String()
	return l
}

package resourcelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

var _ rl.Interface = (*Lock)(nil)

// GroupResource names pg_lease leases in the Kubernetes API errors this
// package returns (NotFound, AlreadyExists, Conflict).
var GroupResource = schema.GroupResource{Group: "pglease.io", Resource: "leases"}

// Defaults.
const (
	DefaultLeaseDuration = 15 * time.Second
	// DefaultMaxMargin caps the default margin (LeaseDuration/10).
	DefaultMaxMargin = time.Second
)

// Options configure a Lock. New fills the defaults and validates them once.
type Options struct {
	// LeaseDuration is the TTL sent to the server with every acquire and
	// renew. The record's LeaseDurationSeconds (whole seconds, possibly 0) is
	// never used for it. Default DefaultLeaseDuration; at least 1ms.
	LeaseDuration time.Duration
	// Margin is how long before Grant.ValidUntil a term ends when no renewal
	// moved it: it covers clock-rate difference between this host and the
	// server and the delay of a timer firing. 0 means the default,
	// min(LeaseDuration/10, DefaultMaxMargin); otherwise 0 < Margin <
	// LeaseDuration.
	Margin time.Duration
	// OnEpochChange, when set, is called synchronously on every change of the
	// epoch under which this lock holds the key: (old, zero Token) when a
	// term ends, after its context was cancelled; (zero Token, new) when a
	// term starts, before the Create or Update that obtained it returns and
	// before Term, Token or TokenContext can return it. Calls never overlap
	// and come in that order, so an end is always reported before the next
	// start. It must not call Get, Create or Update, and should return fast.
	OnEpochChange func(old, new lease.Token)
	// EventRecorder, when set, receives RecordEvent's events (a
	// record.EventRecorder satisfies it).
	EventRecorder rl.EventRecorder
	// EventObject is the object events are recorded about. Default: a
	// coordination.k8s.io/v1 Lease named after the key, in EventNamespace.
	EventObject runtime.Object
	// EventNamespace is the namespace of the default EventObject.
	EventNamespace string
}

// Option sets a field of Options.
type Option func(*Options)

// WithLeaseDuration sets Options.LeaseDuration.
func WithLeaseDuration(d time.Duration) Option { return func(o *Options) { o.LeaseDuration = d } }

// WithMargin sets Options.Margin.
func WithMargin(d time.Duration) Option {
	return func(o *Options) { o.Margin = d }
}

// WithOnEpochChange sets Options.OnEpochChange.
func WithOnEpochChange(f func(old, new lease.Token)) Option {
	return func(o *Options) { o.OnEpochChange = f }
}

// WithEventRecorder sets Options.EventRecorder (and, if obj is not nil,
// Options.EventObject).
func WithEventRecorder(r rl.EventRecorder, obj runtime.Object) Option {
	return func(o *Options) { o.EventRecorder = r; o.EventObject = obj }
}

// WithOptions replaces every field with those of opts (later options still
// apply on top).
func WithOptions(opts Options) Option {
	return func(o *Options) { *o = opts }
}

// Lock is a client-go resourcelock.Interface over one pg_lease key. See the
// package documentation for the contract it keeps.
//
// Each Lock is one candidate: give every process (and every elector) a Lock
// of its own with a unique identity. A Lock is safe for concurrent use; its
// Get, Create and Update run one at a time.
type Lock struct {
	client   *lease.Client
	key      string
	identity string
	opts     Options

	op sync.Mutex // serializes Get, Create, Update

	mu    sync.Mutex
	grant *lease.Grant // what the server last granted us and has not taken back
	term  *Term        // the term of grant; ended terms stay until the grant goes
	obs   rawRecord    // last state seen or written: Get's bytes come from it

	lastCall time.Time // last Get, Create or Update (Check)

	hookMu sync.Mutex // OnEpochChange calls never overlap
}

// New returns a Lock on key for identity. It validates the configuration
// once; each error names the field.
func New(client *lease.Client, key, identity string, opts ...Option) (*Lock, error) {
	var o Options
	for _, f := range opts {
		f(&o)
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.Margin == 0 {
		o.Margin = min(o.LeaseDuration/10, DefaultMaxMargin)
	}
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("client must not be nil"))
	}
	if key == "" {
		errs = append(errs, errors.New("key must not be empty"))
	} else if len(key) > 1024 {
		errs = append(errs, errors.New("key must be at most 1024 bytes"))
	}
	if identity == "" {
		errs = append(errs, errors.New("identity must not be empty"))
	} else if len(identity) > 1024 {
		errs = append(errs, errors.New("identity must be at most 1024 bytes"))
	}
	if o.LeaseDuration < time.Millisecond {
		errs = append(errs, fmt.Errorf("Options.LeaseDuration must be at least 1ms, got %v", o.LeaseDuration))
	}
	if o.Margin < 0 || o.Margin >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("Options.Margin must be >= 0 and below Options.LeaseDuration (%v), got %v",
			o.LeaseDuration, o.Margin))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("resourcelock.New: %w", errors.Join(errs...))
	}
	if o.EventObject == nil {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: key, Namespace: o.EventNamespace}}
		l.Kind = "Lease"
		l.APIVersion = coordinationv1.SchemeGroupVersion.String()
		o.EventObject = l
	}
	return &Lock{client: client, key: key, identity: identity, opts: o}, nil
}

// Identity returns the lock's identity (the owner it presents to pg_lease).
func (l *Lock) Identity() string { return l.identity }

// Key returns the lease key.
func (l *Lock) Key() string { return l.key }

// Describe names the lock in client-go's log lines.
func (l *Lock) Describe() string { return "pg_lease/" + l.key }

// LeaseDuration is the TTL the lock sends (Options.LeaseDuration).
func (l *Lock) LeaseDuration() time.Duration { return l.opts.LeaseDuration }

// Margin is Options.Margin.
func (l *Lock) Margin() time.Duration { return l.opts.Margin }

// RecordEvent records a client-go leader election event ("became leader",
// "stopped leading") on Options.EventRecorder, naming the identity and the
// epoch held when it is recorded.
func (l *Lock) RecordEvent(s string) {
	if l.opts.EventRecorder == nil {
		return
	}
	msg := l.identity + " " + s
	if t := l.Term(); t != nil {
		msg = fmt.Sprintf("%s (epoch %d)", msg, t.Epoch())
	}
	l.opts.EventRecorder.Eventf(l.opts.EventObject, corev1.EventTypeNormal, "LeaderElection", "%s", msg)
}

// Term returns the live term, or nil when the lock holds none (never held,
// lost, released, or past its local deadline).
func (l *Lock) Term() *Term {
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	if t == nil || t.Err() != nil {
		return nil
	}
	return t
}

// Epoch is the epoch of the live term, 0 when there is none.
func (l *Lock) Epoch() int64 {
	if t := l.Term(); t != nil {
		return t.Epoch()
	}
	return 0
}

// Token returns the live term's fencing token; ok is false when the lock
// holds no live, unexpired term.
func (l *Lock) Token() (t lease.Token, ok bool) {
	if tm := l.Term(); tm != nil && tm.Valid() {
		return tm.Token(), true
	}
	return lease.Token{}, false
}

// TokenContext returns a context with the values of parent that carries the
// live term's token (lease.TokenFromContext) and is done when the term ends
// (with the term's cause) or when parent is done. The end of the term
// cancels it synchronously: before OnEpochChange hears of the end and before
// any later term is handed out. It fails with ErrNotHolding when there is no
// live, unexpired term. Call cancel when done.
func (l *Lock) TokenContext(parent context.Context) (context.Context, context.CancelFunc, error) {
	t := l.Term()
	if t == nil || !t.Valid() {
		return nil, nil, fmt.Errorf("%w: %s (identity %q)", ErrNotHolding, l.Describe(), l.identity)
	}
	inner, cancel := context.WithCancelCause(t.Context())
	stop := context.AfterFunc(parent, func() { cancel(context.Cause(parent)) })
	return &termContext{Context: inner, parent: parent}, func() { stop(); cancel(context.Canceled) }, nil
}

// termContext takes its cancellation from a term's context (so that the end
// of the term propagates synchronously to it and its children) and its
// other values from the caller's context.
type termContext struct {
	context.Context
	parent context.Context
}

func (c *termContext) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.parent.Value(key)
}

func (c *termContext) Deadline() (time.Time, bool) { return c.parent.Deadline() }

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

func (r rawRecord) held() bool { return r.Holder != "" }

func (l *Lock) heldRecord(g lease.Grant) rawRecord {
	exp := g.ExpiresAt.UTC()
	return rawRecord{Key: l.key, Epoch: g.Epoch, Holder: l.identity, ExpiresAt: &exp}
}

func (l *Lock) record(r rawRecord) (*rl.LeaderElectionRecord, []byte, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	secs := int((l.opts.LeaseDuration + time.Second - 1) / time.Second)
	return &rl.LeaderElectionRecord{
		HolderIdentity:       r.Holder,
		LeaseDurationSeconds: secs,
		LeaderTransitions:    int(r.Epoch),
	}, raw, nil
}

// Get reads the key (lease.inspect) and returns its record. A key never
// leased gives an error for which apierrors.IsNotFound is true.
func (l *Lock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	l.op.Lock()
	defer l.op.Unlock()
	l.touch()
	s, err := l.client.Inspect(ctx, l.key)
	if err != nil {
		return nil, nil, err
	}
	if !s.Exists {
		// Never leased, or removed by lease.cleanup after it was free: a
		// grant we held is gone either way.
		l.mu.Lock()
		l.obs = rawRecord{}
		t := l.term
		lost := l.grant != nil
		if lost {
			l.grant, l.term = nil, nil
		}
		l.mu.Unlock()
		if lost && t != nil {
			t.end(fmt.Errorf("%w (%w): seen by Get: %s no longer exists", lease.ErrNotOwner, lease.ErrLost, l.key))
		}
		return nil, nil, apierrors.NewNotFound(GroupResource, l.key)
	}

	l.mu.Lock()
	var r rawRecord
	switch {
	case s.Held:
		exp := s.ExpiresAt.UTC()
		r = rawRecord{Key: l.key, Epoch: s.Epoch, Holder: s.Owner, ExpiresAt: &exp}
	case l.obs.held() && l.obs.Epoch == s.Epoch:
		// The grant we last saw lapsed. A lapse is not a write (inspect
		// only hides the lapsed holder), so the bytes stay those of the
		// last write we saw; followers time the expiry themselves.
		r = l.obs
	default:
		r = rawRecord{Key: l.key, Epoch: s.Epoch}
	}
	l.obs = r
	// Does the server still say we hold our grant?
	var lost error
	if g := l.grant; g != nil && !(s.Held && s.Owner == l.identity && s.Epoch == g.Epoch) {
		switch {
		case s.Held && s.Owner == l.identity:
			lost = lease.ErrEpochMismatch
		case s.Epoch == g.Epoch && !s.Held:
			lost = lease.ErrLapsed
		default:
			lost = lease.ErrNotOwner
		}
		lost = fmt.Errorf("%w (%w): seen by Get: %s at epoch %d, held=%v by %q",
			lost, lease.ErrLost, l.key, s.Epoch, s.Held, s.Owner)
		l.grant = nil
	}
	t := l.term
	if lost != nil {
		l.term = nil
	}
	l.mu.Unlock()
	if lost != nil && t != nil {
		t.end(lost)
	}
	return l.record(r)
}

// Create obtains the first grant of a key that was never leased. If the key
// exists, it returns an error for which apierrors.IsAlreadyExists is true and
// changes nothing.
func (l *Lock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.touch()
	if ler.HolderIdentity != l.identity {
		return l.foreignHolder("Create", ler.HolderIdentity)
	}
	l.op.Lock()
	defer l.op.Unlock()
	s, err := l.client.Inspect(ctx, l.key)
	if err != nil {
		return err
	}
	if s.Exists {
		return apierrors.NewAlreadyExists(GroupResource, l.key)
	}
	g, ok, err := l.client.Acquire(ctx, l.key, l.identity, l.opts.LeaseDuration)
	if err != nil {
		return err
	}
	if !ok {
		return apierrors.NewAlreadyExists(GroupResource, l.key)
	}
	// The key did not exist when inspected. (Its first grant carries epoch 1,
	// or, after lease.cleanup removed free keys, one above the database's
	// epoch floor. If another candidate created and freed it in between,
	// this is a grant of a free key: still the server's decision.)
	return l.begin(ctx, g)
}

// Update performs the change client-go asks for, conditionally on what the
// lock holds:
//
//   - HolderIdentity empty: release (lease.release of the held epoch);
//   - this lock holds a live term: renew it (lease.renew with its epoch);
//   - otherwise: acquire (a takeover when the key is free or lapsed).
//
// Every answer of the server that the caller does not (or no longer) hold
// the key is an error for which apierrors.IsConflict is true.
func (l *Lock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.touch()
	if ler.HolderIdentity == "" {
		return l.release(ctx)
	}
	if ler.HolderIdentity != l.identity {
		return l.foreignHolder("Update", ler.HolderIdentity)
	}
	l.op.Lock()
	defer l.op.Unlock()

	l.mu.Lock()
	g, t := l.grant, l.term
	l.mu.Unlock()

	if g != nil && t != nil && t.Err() == nil {
		ng, err := l.client.Renew(ctx, g.Token, l.opts.LeaseDuration)
		switch {
		case errors.Is(err, lease.ErrLost):
			l.lose(t, err)
			return l.conflict(err)
		case err != nil:
			return err // transient: the term lasts until its deadline
		}
		l.mu.Lock()
		l.grant = &ng
		l.obs = l.heldRecord(ng)
		l.mu.Unlock()
		if t.extend(ng.ValidUntil().Add(-l.opts.Margin)) {
			return nil
		}
		// The renewal came back after the term's local deadline: what acted
		// under the term has been told to stop; do not resume it.
		t.end(ErrLocalDeadline)
		g = &ng
	}
	if g != nil {
		// A grant whose term ended locally: give it back so that the next
		// grant (ours or anyone's) carries a new epoch.
		if err := l.giveBack(ctx, *g); err != nil {
			return err
		}
		return l.conflict(fmt.Errorf("%w: term %s ended", ErrLocalDeadline, g.Token))
	}

	ng, ok, err := l.client.Acquire(ctx, l.key, l.identity, l.opts.LeaseDuration)
	if err != nil {
		return err
	}
	if !ok {
		return l.conflict(fmt.Errorf("%s is held by another owner", l.key))
	}
	return l.begin(ctx, ng)
}

// begin starts the term of a new grant g and reports it.
func (l *Lock) begin(ctx context.Context, g lease.Grant) error {
	t := l.newTerm(g)
	l.mu.Lock()
	old := l.term
	l.grant, l.term = &g, nil
	l.obs = l.heldRecord(g)
	l.mu.Unlock()
	if old != nil {
		// Cannot happen (begin runs only when no grant is held), but if it
		// did, the old term must end before the new one is handed out.
		old.end(fmt.Errorf("%w: superseded by epoch %d", lease.ErrEpochMismatch, g.Epoch))
	}
	l.notify(lease.Token{}, g.Token)
	if !t.extend(g.ValidUntil().Add(-l.opts.Margin)) {
		// Granted, but the answer came back after the grant's local
		// deadline: never hand it out.
		t.end(ErrLocalDeadline)
		if err := l.giveBack(ctx, g); err != nil {
			return err
		}
		return l.conflict(fmt.Errorf("%w: grant %s arrived too late to use", ErrLocalDeadline, g.Token))
	}
	l.mu.Lock()
	l.term = t
	l.mu.Unlock()
	return nil
}

func (l *Lock) newTerm(g lease.Grant) *Term {
	ctx, cancel := context.WithCancelCause(lease.ContextWithToken(context.Background(), g.Token))
	t := &Term{token: g.Token, ctx: ctx, cancel: cancel}
	var once sync.Once
	t.end = func(cause error) {
		once.Do(func() {
			if !t.markEnded() {
				return
			}
			cancel(cause)
			l.notify(g.Token, lease.Token{})
		})
	}
	// Armed by the first extend; until then the term is not handed out.
	t.timer = time.AfterFunc(time.Hour, func() { t.end(ErrLocalDeadline) })
	return t
}

// lose ends term t after the server said its grant is gone.
func (l *Lock) lose(t *Term, cause error) {
	l.mu.Lock()
	if l.term == t {
		l.grant, l.term = nil, nil
	}
	l.mu.Unlock()
	t.end(cause)
}

// giveBack releases g after its term ended locally; a lost grant needs no
// release.
func (l *Lock) giveBack(ctx context.Context, g lease.Grant) error {
	err := l.client.Release(ctx, g.Token)
	if err != nil && !errors.Is(err, lease.ErrLost) {
		return err // keep the grant: the next Update tries again
	}
	l.mu.Lock()
	l.grant, l.term = nil, nil
	if err == nil {
		l.obs = rawRecord{Key: l.key, Epoch: g.Epoch + 1}
	}
	l.mu.Unlock()
	return nil
}

// release is Update with an empty HolderIdentity. The term ends (everything
// acting under it is told) before the server frees the key.
func (l *Lock) release(ctx context.Context) error {
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	g, t := l.grant, l.term
	l.mu.Unlock()
	if g == nil {
		return fmt.Errorf("resourcelock: release of %s: %w", l.key, ErrNotHolding)
	}
	if t != nil {
		t.end(ErrReleased)
	}
	err := l.client.Release(ctx, g.Token)
	switch {
	case err == nil:
	case errors.Is(err, lease.ErrLost):
		l.mu.Lock()
		l.grant, l.term = nil, nil
		l.mu.Unlock()
		return fmt.Errorf("resourcelock: nothing to release: %w", err)
	default:
		return err
	}
	l.mu.Lock()
	l.grant, l.term = nil, nil
	l.obs = rawRecord{Key: l.key, Epoch: g.Epoch + 1}
	l.mu.Unlock()
	return nil
}

func (l *Lock) notify(old, new lease.Token) {
	if l.opts.OnEpochChange == nil {
		return
	}
	l.hookMu.Lock()
	defer l.hookMu.Unlock()
	l.opts.OnEpochChange(old, new)
}

// conflictError is a Conflict StatusError that also unwraps to its cause, so
// that errors.Is finds lease.ErrLapsed and the like.
type conflictError struct {
	*apierrors.StatusError
	cause error
}

func (e *conflictError) Unwrap() error { return e.cause }

func (l *Lock) conflict(cause error) error {
	return &conflictError{StatusError: apierrors.NewConflict(GroupResource, l.key, cause), cause: cause}
}

func (l *Lock) foreignHolder(op, holder string) error {
	return apierrors.NewBadRequest(fmt.Sprintf("resourcelock: %s of %s with HolderIdentity %q: this lock only writes its own identity %q",
		op, l.key, holder, l.identity))
}

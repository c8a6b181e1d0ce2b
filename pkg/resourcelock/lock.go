package resourcelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/internal/candidacy"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

var _ rl.Interface = (*Lock)(nil)

// groupResource names pg_lease leases (pglease.io/leases) in the Kubernetes
// API errors this package returns (NotFound, AlreadyExists, Conflict).
var groupResource = schema.GroupResource{Group: "pglease.io", Resource: "leases"}

// ErrNotHolding: the lock holds no live term (TokenContext, a release with
// nothing to release).
var ErrNotHolding = errors.New("resourcelock: this lock holds no live term")

// ErrStoppedLeading is the cause of a term that ended because client-go's
// elector stopped leading (RecordEvent) while the grant was still valid.
var ErrStoppedLeading = errors.New("resourcelock: client-go stopped leading")

// Lock is a client-go resourcelock.Interface over one pg_lease key. See the
// package documentation for the contract it keeps.
//
// Each Lock is one candidate: give every process (and every elector) a Lock
// of its own with a unique identity. A Lock is safe for concurrent use; its
// Get, Create and Update run one at a time.
type Lock struct {
	client *lease.Client
	cfg    Config // completed by Config.withDefaults
	events *events

	op  sync.Mutex           // serializes Get, Create, Update
	reg *candidacy.Registrar // nil without a Candidacy; under op

	mu       sync.Mutex
	term     *lease.Term // the term of the grant the server last gave us and has not taken back; an ended term stays until its grant is given back
	obs      rawRecord   // last state seen or written: Get's bytes come from it
	seen     bool        // a Get or Create ran: Update may act
	returned bool        // a Get returned a record (or NotFound): the next may wait
	graceEnd time.Time   // an acquire met a promotion's grace: the next Get sleeps until it ends
	// mine and notMine are the last epochs of a grant under this identity,
	// not one of this lock's terms, that the server said is this role's
	// (a handover, an earlier incarnation's grant) or is not (another
	// session's: owner strings are not authenticated).
	mine, notMine int64

	lastCall time.Time // last Get, Create or Update (Check)

	hookMu sync.Mutex // OnEpochChange calls never overlap
}

// New returns a Lock as c says. It fills the defaults of c and checks all
// of it once: the error joins one *FieldError for each offending field
// (each names the field and matches lease.ErrInvalidInput).
func New(client *lease.Client, c Config) (*Lock, error) {
	var errs []error
	if client == nil {
		errs = append(errs, fmt.Errorf("%w: client must not be nil", lease.ErrInvalidInput))
	}
	c, cerrs := c.withDefaults()
	if errs = append(errs, cerrs...); len(errs) > 0 {
		return nil, fmt.Errorf("resourcelock.New: %w", errors.Join(errs...))
	}
	ev := &events{recorder: c.EventRecorder, object: c.EventObject, given: c.EventObject != nil}
	if ev.object == nil {
		ev.object = eventLease(c.Key, c.EventNamespace)
	}
	l := &Lock{client: client, cfg: c, events: ev}
	if c.Candidacy != nil {
		l.reg = candidacy.New(client, c.Key, c.Identity, c.LeaseDuration, *c.Candidacy)
	}
	return l, nil
}

// Identity returns the lock's identity (the owner it presents to pg_lease).
func (l *Lock) Identity() string { return l.cfg.Identity }

// Key returns the lease key.
func (l *Lock) Key() string { return l.cfg.Key }

// Describe names the lock in client-go's log lines.
func (l *Lock) Describe() string { return "pg_lease/" + l.cfg.Key }

// maxFollowerWait bounds how long a follower's Get waits for news.
const maxFollowerWait = 10 * time.Minute

// Get reads the key (lease.inspect) and returns its record. A key never
// leased gives an error for which apierrors.IsNotFound is true.
//
// A follower's Get (the lock holds no grant, and the record it last
// returned names another holder) waits, when the lock has a Waiter,
// until the record differs from the last one it returned in what matters
// to an election (the holder or the epoch: a grant, a release, a takeover,
// the server-side lapse of the grant), or maxFollowerWait, or ctx ends
// (then it returns ctx's error). The holder's Get never waits, nor does
// the first Get, but for a candidate (Config.Candidacy): its first Get
// waits too while another identity holds the key.
func (l *Lock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	l.op.Lock()
	defer l.op.Unlock()
	l.touch()
	l.mu.Lock()
	t, last, returned, graceEnd := l.term, l.obs, l.returned, l.graceEnd
	l.graceEnd = time.Time{}
	l.mu.Unlock()
	follower := t == nil && last.Holder != l.cfg.Identity

	var (
		s   lease.State
		err error
	)
	if follower && l.reg != nil {
		l.refresh(ctx)
	}
	if follower && !graceEnd.IsZero() {
		// The last acquire met a promotion's grace. Its end changes no
		// record and sends no notification: sleep until it, then read.
		if d := graceEnd.Sub(l.client.Clock().Now()); d > 0 {
			tm := l.client.Clock().NewTimer(d)
			select {
			case <-tm.C():
			case <-ctx.Done():
			}
			tm.Stop()
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
		}
		s, err = l.inspect(ctx, follower)
	} else if w := l.cfg.Waiter; follower && returned && w != nil && last.Holder != "" {
		// Held by another when last read: wait for news. A key last read
		// free (or absent) is read at once: client-go then acquires it, and
		// if that acquire failed, no change would come to wake a wait.
		s, err = l.await(ctx, w, last)
	} else if follower && w != nil && l.reg != nil {
		// A candidate's first Get waits while another holds the key:
		// client-go's RetryPeriod after a first Get that returned at
		// once would leave it deaf to a grant handed to it.
		s, err = l.inspect(ctx, follower)
		if err == nil && s.Held && s.Owner != l.cfg.Identity {
			s, err = l.await(ctx, w, l.recordOf(s))
		}
	} else {
		s, err = l.inspect(ctx, follower)
	}
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	l.seen, l.returned = true, true
	t = l.term
	l.mu.Unlock()

	// Does the server still say we hold our grant?
	if t != nil {
		if g := t.Grant(); !(s.Held && s.Owner == l.cfg.Identity && s.Epoch == g.Epoch) {
			var lost error
			switch {
			case !s.Exists:
				// Never leased, or removed by lease.cleanup after it was
				// free: a grant we held is gone either way.
				lost = lease.ErrNotOwner
			case s.Held && s.Owner == l.cfg.Identity:
				lost = lease.ErrEpochMismatch
			case s.Epoch == g.Epoch && !s.Held:
				lost = lease.ErrLapsed
			default:
				lost = lease.ErrNotOwner
			}
			l.lose(t, fmt.Errorf("%w (%w): seen by Get: %s at epoch %d, exists=%v held=%v by %q",
				lost, lease.ErrLost, l.cfg.Key, s.Epoch, s.Exists, s.Held, s.Owner))
		}
	}

	if s.Held && s.Owner == l.cfg.Identity && (t == nil || t.Grant().Epoch != s.Epoch) {
		if err := l.checkOwn(ctx, s.Epoch); err != nil {
			return nil, nil, err
		}
	}
	r := l.recordOf(s)
	l.mu.Lock()
	l.obs = r
	l.mu.Unlock()
	if !s.Exists {
		return nil, nil, apierrors.NewNotFound(groupResource, l.cfg.Key)
	}
	return l.record(r)
}

// checkOwn asks the server, once per epoch, whether the grant of epoch held
// under this lock's identity, which is not one of the lock's terms, is this
// database role's: lease.fence in a statement of its own, a read whose row
// lock ends with the statement. A grant that is not (another role holds
// the key under this identity) is shown to client-go under another holder
// name (recordOf), so that it neither reports itself leader nor starts
// leading.
func (l *Lock) checkOwn(ctx context.Context, epoch int64) error {
	l.mu.Lock()
	known := epoch == l.mine || epoch == l.notMine
	l.mu.Unlock()
	if known {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.followerTimeout())
	defer cancel()
	tok := lease.Token{Key: l.cfg.Key, Owner: l.cfg.Identity, Epoch: epoch}
	_, err := l.client.Check(ctx, tok)
	if err != nil && !errors.Is(err, lease.ErrLost) {
		return err
	}
	l.mu.Lock()
	if err == nil {
		l.mine = epoch
	} else {
		l.notMine = epoch
	}
	l.mu.Unlock()
	return nil
}

// refresh renews a candidate's registration when due. A failed
// registration only costs this follower its handover; the next try may
// succeed.
func (l *Lock) refresh(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, l.followerTimeout())
	_ = l.reg.Refresh(rctx)
	cancel()
}

// await waits, for a follower's Get, until the record differs from last in
// holder or epoch, or maxFollowerWait, and then reads it. A candidate renews
// its registration inside the wait, when due and as soon as its readiness
// changes: returning instead would leave it asleep for client-go's
// RetryPeriod, deaf to a grant handed to it meanwhile.
func (l *Lock) await(ctx context.Context, w *listen.Waiter, last rawRecord) (lease.State, error) {
	changed := func(st lease.State) bool {
		r := l.recordOf(st)
		return r.Key != last.Key || r.Holder != last.Holder || r.Epoch != last.Epoch
	}
	deadline := time.Now().Add(maxFollowerWait)
	for {
		limit := time.Until(deadline)
		waitCtx, stopReady := ctx, context.CancelFunc(func() {})
		if l.reg != nil {
			limit = min(limit, l.reg.Interval())
			waitCtx, stopReady = l.reg.WatchReady(ctx)
		}
		wctx, cancel := context.WithTimeout(waitCtx, limit)
		s, err := listen.Await(wctx, w, l.client, l.cfg.Key, l.followerPoll(), changed)
		cancel()
		stopReady()
		if err == nil || ctx.Err() != nil || wctx.Err() == nil {
			return s, err
		}
		// Nothing happened: the registration is due, the readiness
		// changed, or the wait is over.
		if l.reg == nil || !time.Now().Before(deadline) {
			return l.inspect(ctx, true) // report the current record
		}
		l.refresh(ctx)
	}
}

// inspect reads the key; a follower's read gets a deadline of its own
// (client-go's acquire loop passes a context without one), so that a
// silently dead connection cannot stall it.
func (l *Lock) inspect(ctx context.Context, follower bool) (lease.State, error) {
	if follower {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.followerTimeout())
		defer cancel()
	}
	return l.client.Inspect(ctx, l.cfg.Key)
}

// followerTimeout bounds each call a follower makes.
func (l *Lock) followerTimeout() time.Duration { return max(l.cfg.LeaseDuration, time.Second) }

// followerPoll bounds how late a waiting follower sees a change that sent
// no notification (pg_lease.notify = off on the writer, the listen
// connection down).
func (l *Lock) followerPoll() time.Duration { return min(l.cfg.LeaseDuration/2, time.Second) }

// Create obtains the first grant of a key that was never leased. If the key
// exists, it returns an error for which apierrors.IsAlreadyExists is true and
// changes nothing.
func (l *Lock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.touch()
	if ler.HolderIdentity != l.cfg.Identity {
		return l.foreignHolder("Create", ler.HolderIdentity)
	}
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	l.seen = true
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.followerTimeout())
	defer cancel()
	s, err := l.client.Inspect(ctx, l.cfg.Key)
	if err != nil {
		return err
	}
	if s.Exists {
		return apierrors.NewAlreadyExists(groupResource, l.cfg.Key)
	}
	g, ok, err := l.client.Acquire(ctx, l.cfg.Key, l.cfg.Identity, l.cfg.LeaseDuration)
	if err != nil {
		return l.graceConflict(err)
	}
	if !ok {
		return apierrors.NewAlreadyExists(groupResource, l.cfg.Key)
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
// the key is an error for which apierrors.IsConflict is true. An Update
// before any Get or Create is refused (BadRequest): client-go always reads
// the record first, and a lock must not take a key it never looked at.
func (l *Lock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.touch()
	if ler.HolderIdentity == "" {
		return l.release(ctx)
	}
	if ler.HolderIdentity != l.cfg.Identity {
		return l.foreignHolder("Update", ler.HolderIdentity)
	}
	l.op.Lock()
	defer l.op.Unlock()

	l.mu.Lock()
	t, seen := l.term, l.seen
	l.mu.Unlock()
	if !seen {
		return apierrors.NewBadRequest(fmt.Sprintf("resourcelock: Update of %s before any Get or Create", l.cfg.Key))
	}

	if t != nil && t.Err() == nil {
		err := t.Renew(ctx)
		switch {
		case err == nil:
			l.mu.Lock()
			l.obs = l.heldRecord(t.Grant())
			l.mu.Unlock()
			return nil
		case errors.Is(err, lease.ErrLost):
			l.drop(t)
			return l.conflict(err)
		case !errors.Is(err, lease.ErrLocalDeadline):
			return err // transient: the term lasts until its deadline
		}
		// The renewal came back after the term's local deadline: what acted
		// under the term has been told to stop; do not resume it.
	}
	if t != nil {
		// A grant whose term ended locally: give it back so that the next
		// grant (ours or anyone's) carries a new epoch.
		if err := l.giveBack(ctx, t); err != nil {
			return err
		}
		return l.conflict(fmt.Errorf("%w: term %s ended", t.Err(), t.Grant().Token))
	}

	actx, cancel := context.WithTimeout(ctx, l.followerTimeout())
	defer cancel()
	g, ok, err := l.client.Acquire(actx, l.cfg.Key, l.cfg.Identity, l.cfg.LeaseDuration)
	if err != nil {
		return l.graceConflict(err)
	}
	if !ok {
		return l.conflict(fmt.Errorf("%s is held by another owner", l.cfg.Key))
	}
	return l.begin(ctx, g)
}

// conflictError is a Conflict StatusError that also unwraps to its cause, so
// that errors.Is finds lease.ErrLapsed and the like.
type conflictError struct {
	*apierrors.StatusError
	cause error
}

func (e *conflictError) Unwrap() error { return e.cause }

// graceConflict turns an acquire's error into Create's and Update's answer:
// a promotion's grace is a conflict (the key cannot be taken now), and the
// next Get sleeps until the grace ends instead of waiting for a change that
// its end does not make. Other errors are returned as they are.
func (l *Lock) graceConflict(err error) error {
	var ge *lease.GraceError
	if !errors.As(err, &ge) {
		return err
	}
	l.mu.Lock()
	l.graceEnd = ge.UntilLocal
	l.mu.Unlock()
	return l.conflict(err)
}

func (l *Lock) conflict(cause error) error {
	return &conflictError{StatusError: apierrors.NewConflict(groupResource, l.cfg.Key, cause), cause: cause}
}

func (l *Lock) foreignHolder(op, holder string) error {
	return apierrors.NewBadRequest(fmt.Sprintf("resourcelock: %s of %s with HolderIdentity %q: this lock only writes its own identity %q",
		op, l.cfg.Key, holder, l.cfg.Identity))
}

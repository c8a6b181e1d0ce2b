package resourcelock_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

func rec(id string) rl.LeaderElectionRecord {
	return rl.LeaderElectionRecord{HolderIdentity: id, LeaseDurationSeconds: 15}
}

// mustLock is New on key for id with the rest of opts (at most one; none:
// the defaults).
func mustLock(t *testing.T, c *lease.Client, key, id string, opts ...resourcelock.Config) *resourcelock.Lock {
	t.Helper()
	var o resourcelock.Config
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		t.Fatal("mustLock: more than one Config")
	}
	o.Key, o.Identity = key, id
	l, err := resourcelock.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func get(t *testing.T, l *resourcelock.Lock) (*rl.LeaderElectionRecord, []byte) {
	t.Helper()
	r, raw, err := l.Get(context.Background())
	if err != nil {
		t.Fatalf("%s Get: %v", l.Identity(), err)
	}
	return r, raw
}

func TestNewValidatesEachField(t *testing.T) {
	c := lease.New(nil)
	for _, tc := range []struct {
		name     string
		client   *lease.Client
		key, id  string
		opts     resourcelock.Config
		wantInEr []string
		fields   []string // the FieldErrors, in order
	}{
		{"nil client", nil, "k", "a", resourcelock.Config{}, []string{"client"}, nil},
		{"empty key and identity", c, "", "", resourcelock.Config{}, []string{"key", "identity"}, []string{"Key", "Identity"}},
		{"long key", c, strings.Repeat("k", 1025), "a", resourcelock.Config{}, []string{"key must be at most 1024 bytes"}, []string{"Key"}},
		{"ttl below 3ms", c, "k", "a", resourcelock.Config{LeaseDuration: 2 * time.Millisecond}, []string{"LeaseDuration"}, []string{"LeaseDuration"}},
		{"negative ttl", c, "k", "a", resourcelock.Config{LeaseDuration: -time.Second}, []string{"LeaseDuration"}, []string{"LeaseDuration"}},
		{"margin above ttl/3", c, "k", "a", resourcelock.Config{LeaseDuration: time.Second, Margin: time.Second}, []string{"Margin"}, []string{"Margin"}},
		{"negative margin", c, "k", "a", resourcelock.Config{Margin: -1}, []string{"Margin"}, []string{"Margin"}},
		{"renew deadline past the TTL", c, "k", "a", resourcelock.Config{LeaseDuration: time.Second, RenewDeadline: 900 * time.Millisecond},
			[]string{"RenewDeadline (900ms) + RetryPeriod (133.333333ms)", "must be below the lock's lease duration (1s) minus its margin (101ms)"},
			[]string{"RenewDeadline"}},
		{"negative retry period", c, "k", "a", resourcelock.Config{RetryPeriod: -1}, []string{"RetryPeriod (-1ns) must be positive"}, []string{"RetryPeriod"}},
		{"retry jitter", c, "k", "a", resourcelock.Config{LeaseDuration: time.Minute, RenewDeadline: 10 * time.Second, RetryPeriod: 9 * time.Second},
			[]string{"RenewDeadline (10s) must be greater than RetryPeriod (9s) x JitterFactor"}, []string{"RenewDeadline"}},
		{"candidate version", c, "k", "a", resourcelock.Config{Candidacy: &handover.Candidacy{Version: "one.two"}},
			[]string{"Candidacy", "not a semantic version"}, []string{"Candidacy"}},
		{"candidate strategy", c, "k", "a", resourcelock.Config{Candidacy: &handover.Candidacy{Strategy: "fastest"}},
			[]string{"Candidacy", "strategy"}, []string{"Candidacy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.opts
			cfg.Key, cfg.Identity = tc.key, tc.id
			_, err := resourcelock.New(tc.client, cfg)
			if !errors.Is(err, lease.ErrInvalidInput) {
				t.Fatalf("New: %v, want an error matching lease.ErrInvalidInput", err)
			}
			for _, w := range tc.wantInEr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			var fields []string
			var joined interface{ Unwrap() []error }
			if errors.As(err, &joined) {
				for _, e := range joined.Unwrap() {
					var fe *resourcelock.FieldError
					if errors.As(e, &fe) {
						fields = append(fields, fe.Field)
					}
				}
			}
			if strings.Join(fields, ",") != strings.Join(tc.fields, ",") {
				t.Errorf("FieldErrors %q, want %q", fields, tc.fields)
			}
		})
	}
	l, err := resourcelock.New(c, resourcelock.Config{Key: "k", Identity: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if d := resourcelock.LeaseDuration(l); d != 15*time.Second {
		t.Errorf("defaults: LeaseDuration %v", d)
	}
	if l.Identity() != "a" || l.Describe() != "pg_lease/k" {
		t.Errorf("Identity %q Describe %q", l.Identity(), l.Describe())
	}
}

// Get on a key never leased: IsNotFound (client-go then calls Create).
// Create obtains epoch 1; Create on an existing lease: AlreadyExists, whether
// it is held or free.
func TestGetNotFoundAndCreate(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	a := mustLock(t, newClient(t, dsn), "k", "a")
	b := mustLock(t, newClient(t, dsn), "k", "b")

	_, _, err := a.Get(ctx)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("Get on a never-leased key: %v, want NotFound", err)
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	if epochOf(a) != 1 {
		t.Fatalf("epoch after Create = %d, want 1", epochOf(a))
	}
	if err := b.Create(ctx, rec("b")); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("Create on a held lease: %v, want AlreadyExists", err)
	}
	if err := a.Update(ctx, rec("")); err != nil { // release
		t.Fatal(err)
	}
	if err := b.Create(ctx, rec("b")); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("Create on a free lease: %v, want AlreadyExists", err)
	}
	if epochOf(b) != 0 {
		t.Fatalf("a failed Create handed out epoch %d", epochOf(b))
	}
	r, _ := get(t, b)
	if r.HolderIdentity != "" || r.LeaderTransitions != 2 {
		t.Fatalf("after release: %+v, want free at epoch 2", r)
	}
	// Create writes only the lock's own identity.
	if err := b.Create(ctx, rec("someone-else")); !apierrors.IsBadRequest(err) {
		t.Fatalf("Create with a foreign identity: %v", err)
	}
}

// Update with no version: acquire when free, renew when held, Conflict when
// another owner holds the key, and release on an empty HolderIdentity.
func TestUpdateAcquireRenewRelease(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	a := mustLock(t, newClient(t, dsn), "k", "a")
	b := mustLock(t, newClient(t, dsn), "k", "b")

	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	s0, _ := admin.Inspect(ctx, "k")
	if _, _, err := b.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(ctx, rec("b")); !apierrors.IsConflict(err) {
		t.Fatalf("Update while another holds the key: %v, want Conflict", err)
	}
	if err := a.Update(ctx, rec("a")); err != nil {
		t.Fatalf("renew: %v", err)
	}
	s1, _ := admin.Inspect(ctx, "k")
	if s1.Epoch != 1 || s1.Owner != "a" || !s1.ExpiresAt.After(s0.ExpiresAt) {
		t.Fatalf("renew: %+v after %+v, want same epoch, later expiry", s1, s0)
	}
	term := resourcelock.TermOf(a)
	if err := a.Update(ctx, rec("")); err != nil {
		t.Fatalf("release: %v", err)
	}
	if s, _ := admin.Inspect(ctx, "k"); s.Held || s.Epoch != 2 {
		t.Fatalf("after release: %+v, want free with counter 2", s)
	}
	if !errors.Is(term.Err(), lease.ErrReleased) || epochOf(a) != 0 {
		t.Fatalf("after release: term err %v, Epoch %d", term.Err(), epochOf(a))
	}
	if err := a.Update(ctx, rec("")); err == nil || apierrors.IsConflict(err) {
		t.Fatalf("second release: %v, want a non-Conflict error (client-go retries only Conflicts)", err)
	}
	if err := b.Update(ctx, rec("b")); err != nil {
		t.Fatalf("acquire of a free key: %v", err)
	}
	if epochOf(b) != 3 {
		t.Fatalf("acquire after release: epoch %d, want 3", epochOf(b))
	}
}

// Two candidates that both saw the key free race; exactly one wins and the
// other gets Conflict.
func TestLostRaceIsConflict(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	seed := mustLock(t, newClient(t, dsn), "k", "seed")
	if err := seed.Create(ctx, rec("seed")); err != nil {
		t.Fatal(err)
	}
	if err := seed.Update(ctx, rec("")); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		var locks []*resourcelock.Lock
		for _, id := range []string{"a", "b", "c"} {
			l := mustLock(t, newClient(t, dsn), "k", id)
			if r, _ := get(t, l); r.HolderIdentity != "" {
				t.Fatalf("round %d: key not free: %+v", round, r)
			}
			locks = append(locks, l)
		}
		errs := make([]error, len(locks))
		var wg sync.WaitGroup
		for i, l := range locks {
			wg.Go(func() { errs[i] = l.Update(ctx, rec(l.Identity())) })
		}
		wg.Wait()
		var winners int
		for i, err := range errs {
			switch {
			case err == nil:
				winners++
				if err := locks[i].Update(ctx, rec("")); err != nil {
					t.Fatal(err)
				}
			case !apierrors.IsConflict(err):
				t.Fatalf("round %d: loser %s: %v, want Conflict", round, locks[i].Identity(), err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners", round, winners)
		}
	}
}

// The TTL sent comes from Config.LeaseDuration, never from the record's
// whole-second LeaseDurationSeconds (0 here, and the elector truncates).
// Checked on what the lock sends (every duration argument of its acquire
// and renew) and on the server's arithmetic (expiry minus grant time), so
// no bound depends on how long a call took.
func TestTTLFromOwnConfiguration(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	ttl := 50*time.Minute + 500*time.Millisecond // below 0.3.0's default max_ttl (1 hour)
	sent := &pgtest.Statements{}
	a := mustLock(t, lease.New(pgtest.NewPool(t, dsn, sent.Traced)),
		"k", "a", resourcelock.Config{LeaseDuration: ttl})
	r := rec("a")
	r.LeaseDurationSeconds = 0
	if err := a.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	checked := 0
	check := func(op, fn string) {
		t.Helper()
		// The first duration argument of each call of fn since the last
		// check: the ttl, which comes before acquire's wait.
		var got []time.Duration
		all := sent.All()
		for _, st := range all[checked:] {
			if !st.Calls(fn) {
				continue
			}
			for _, a := range st.Args {
				if d, ok := a.(time.Duration); ok {
					got = append(got, d)
					break
				}
			}
		}
		checked = len(all)
		if len(got) == 0 {
			t.Fatalf("%s sent no %s with a duration", op, fn)
		}
		for _, d := range got {
			if d != ttl {
				t.Fatalf("%s sent %s with %v, want %v", op, fn, d, ttl)
			}
		}
		s, err := admin.Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !s.Held || s.Owner != "a" {
			t.Fatalf("after %s: held=%t owner=%q, want held by a", op, s.Held, s.Owner)
		}
		if left := s.ExpiresAt.Sub(s.ServerNow); left > ttl {
			t.Fatalf("after %s the server holds the grant for %v more, above the TTL %v", op, left, ttl)
		}
	}
	check("Create", "lease.acquire")
	s, err := admin.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := s.ExpiresAt.Sub(s.AcquiredAt); d != ttl {
		t.Fatalf("the server granted %v (expiry minus grant time), want %v", d, ttl)
	}
	if err := a.Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	check("renew", "lease.renew")
	got, _ := get(t, a)
	if got.LeaseDurationSeconds != 3001 {
		t.Fatalf("LeaseDurationSeconds = %d, want 3001 (TTL rounded up)", got.LeaseDurationSeconds)
	}
	b := mustLock(t, newClient(t, dsn), "k2", "b", resourcelock.Config{LeaseDuration: 900 * time.Millisecond})
	if err := b.Create(ctx, rec("b")); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(t, b); got.LeaseDurationSeconds != 1 {
		t.Fatalf("sub-second TTL: LeaseDurationSeconds = %d, want 1, never 0", got.LeaseDurationSeconds)
	}
}

// The raw bytes from Get change exactly when the key's state changes on the
// server: a write (grant, renewal, release) or the server-side lapse of the
// grant (then the key reads as free, and a follower takes over at the
// server's expiry); never because of a read or because time passed. The
// same state gives the same bytes to every lock.
func TestRawBytesChangeOnlyOnStateChanges(t *testing.T) {
	dsn := newDB(t)
	ctx := context.Background()
	admin := newClient(t, dsn)
	// The steps before the lapse assume the holder's grant is still held:
	// when the server says it lapsed midway, they are redone on a new key
	// with a grant twice as long.
	var (
		key    string
		h, f   *resourcelock.Lock
		b3     []byte
		lapsed = func() bool {
			t.Helper()
			s, err := admin.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return !s.Held
		}
	)
	for ttl := 1500 * time.Millisecond; ; ttl *= 2 {
		key = "k-" + ttl.String()
		h = mustLock(t, newClient(t, dsn), key, "holder", resourcelock.Config{LeaseDuration: ttl})
		f = mustLock(t, newClient(t, dsn), key, "follower", resourcelock.Config{LeaseDuration: ttl})
		if b3 = rawBeforeLapse(t, h, f, lapsed); b3 != nil {
			break
		}
		t.Logf("the grant of %v lapsed before the steps that need it held; again with a longer one", ttl)
	}
	// Lapse: the server decided a change, so the key reads as free.
	pgtest.WaitLapsed(t, admin, key, time.Minute)
	r4, b4 := get(t, f)
	if bytes.Equal(b3, b4) || r4.HolderIdentity != "" || r4.LeaderTransitions != 1 {
		t.Fatalf("lapse: %+v %s after %s, want the key free at epoch 1", r4, b4, b3)
	}
	if _, b4b := get(t, mustLock(t, newClient(t, dsn), key, "other")); !bytes.Equal(b4, b4b) {
		t.Fatalf("two locks read different bytes for the same lapsed key:\n%s\n%s", b4, b4b)
	}
	if _, b4c := get(t, f); !bytes.Equal(b4, b4c) {
		t.Fatal("bytes of a lapsed key changed without a write")
	}
	// Takeover: a grant, so a change.
	if err := f.Update(ctx, rec("follower")); err != nil {
		t.Fatal(err)
	}
	r5, b5 := get(t, h)
	if bytes.Equal(b4, b5) || r5.HolderIdentity != "follower" || r5.LeaderTransitions != 2 {
		t.Fatalf("takeover: %+v %s", r5, b5)
	}
	// Release: a write, so a change.
	if err := f.Update(ctx, rec("")); err != nil {
		t.Fatal(err)
	}
	r6, b6 := get(t, h)
	if bytes.Equal(b5, b6) || r6.HolderIdentity != "" || r6.LeaderTransitions != 3 {
		t.Fatalf("release: %+v %s", r6, b6)
	}
	if _, b7 := get(t, h); !bytes.Equal(b6, b7) {
		t.Fatal("bytes of a free key changed without a write")
	}
}

// rawBeforeLapse creates h's grant, reads it, and renews it, checking the
// bytes of each read; it returns the bytes after the renewal, or nil when
// the server says the grant lapsed (or an answer came past its local
// deadline) before a step that needs it held.
func rawBeforeLapse(t *testing.T, h, f *resourcelock.Lock, lapsed func() bool) []byte {
	t.Helper()
	ctx := context.Background()
	// A grant or renewal answered past its local deadline is of no use.
	late := func(err error) bool { return errors.Is(err, lease.ErrLocalDeadline) || lapsed() }
	if err := h.Create(ctx, rec("holder")); err != nil {
		if late(err) {
			return nil
		}
		t.Fatal(err)
	}
	r1, b1 := get(t, f)
	if r1.HolderIdentity != "holder" || r1.LeaderTransitions != 1 {
		if lapsed() {
			return nil
		}
		t.Fatalf("record %+v", r1)
	}
	time.Sleep(20 * time.Millisecond) // server time moves; a read-time value would show it
	if _, b2 := get(t, f); !bytes.Equal(b1, b2) {
		if lapsed() {
			return nil
		}
		t.Fatalf("bytes changed without a write:\n%s\n%s", b1, b2)
	}
	if err := h.Update(ctx, rec("holder")); err != nil { // renew
		if late(err) {
			return nil
		}
		t.Fatal(err)
	}
	_, b3 := get(t, f)
	if bytes.Equal(b1, b3) {
		t.Fatal("bytes did not change on a renewal")
	}
	if _, hb := get(t, h); !bytes.Equal(hb, b3) {
		if lapsed() {
			return nil
		}
		t.Fatalf("holder and follower see different bytes for the same write:\n%s\n%s", hb, b3)
	}
	return b3
}

// A lock whose TTL is too short for client-go's default proportions (below
// about 503ms with the default margin) is made when its timings are left
// zero, as every TTL of at least 3ms is: the timings are then checked where
// client-go's are filled in (LeaderElectionConfig), and timings that keep
// the rule are accepted there.
func TestNewShortTTLWithoutTimings(t *testing.T) {
	c := lease.New(nil)
	for _, ttl := range []time.Duration{3 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond} {
		l, err := resourcelock.New(c, resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: ttl})
		if err != nil {
			t.Errorf("New with LeaseDuration %v and no timings: %v", ttl, err)
			continue
		}
		_, err = l.LeaderElectionConfig(leaderelection.LeaderElectionConfig{})
		var fe *resourcelock.FieldError
		if !errors.As(err, &fe) || fe.Field != "RenewDeadline" {
			t.Errorf("LeaderElectionConfig with the default proportions of %v: %v, want a RenewDeadline FieldError", ttl, err)
		}
	}
	l, err := resourcelock.New(c, resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.LeaderElectionConfig(leaderelection.LeaderElectionConfig{
		RenewDeadline: 150 * time.Millisecond, RetryPeriod: 30 * time.Millisecond,
	}); err != nil {
		t.Errorf("LeaderElectionConfig with timings that keep the rule: %v", err)
	}
	// Timings given in the Config are checked by New.
	if _, err := resourcelock.New(c, resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: 300 * time.Millisecond,
		RenewDeadline: 200 * time.Millisecond}); !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("New with RenewDeadline 200ms for 300ms: %v, want ErrInvalidInput", err)
	}
}

// The default proportions of a TTL near time.Duration's range do not
// overflow: 2/3 and 2/15 of it, as for any other TTL.
func TestTimingHugeTTL(t *testing.T) {
	for _, ttl := range []time.Duration{200 * 365 * 24 * time.Hour, math.MaxInt64} {
		cfg, err := resourcelock.Timing(ttl, 0, leaderelection.LeaderElectionConfig{})
		if err != nil {
			t.Errorf("Timing(%v): %v", ttl, err)
			continue
		}
		if rd, rp := float64(cfg.RenewDeadline)/float64(ttl), float64(cfg.RetryPeriod)/float64(ttl); math.Abs(rd-2.0/3) > 1e-9 || math.Abs(rp-2.0/15) > 1e-9 {
			t.Errorf("Timing(%v): RenewDeadline %v, RetryPeriod %v, want 2/3 and 2/15 of it", ttl, cfg.RenewDeadline, cfg.RetryPeriod)
		}
	}
	// Nor does the sum of RenewDeadline and RetryPeriod.
	if _, err := resourcelock.Timing(math.MaxInt64, 0, leaderelection.LeaderElectionConfig{
		RenewDeadline: math.MaxInt64 - time.Second, RetryPeriod: 2 * time.Second,
	}); err == nil {
		t.Errorf("Timing accepted a RenewDeadline + RetryPeriod past time.Duration's range")
	}
	if cfg, _ := resourcelock.Timing(15*time.Second, 0, leaderelection.LeaderElectionConfig{}); cfg.RenewDeadline != 10*time.Second || cfg.RetryPeriod != 2*time.Second {
		t.Errorf("Timing(15s): %v, %v", cfg.RenewDeadline, cfg.RetryPeriod)
	}
}

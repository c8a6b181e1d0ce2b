package robustness

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ClientConfig is one workload client. Encoded as JSON for worker processes.
type ClientConfig struct {
	ID    int             `json:"id"`
	Seed  int64           `json:"seed"`
	DSN   string          `json:"dsn"`
	Keys  []string        `json:"keys"`
	TTLs  []time.Duration `json:"ttls"`  // per key (fixed per key: renewals never shorten a grant unless the clock steps back)
	Until int64           `json:"until"` // Mono() after which no operation starts
	// OpTimeout bounds every statement on the client side (a blackholed
	// connection hangs until then). Zero: 3 s.
	OpTimeout time.Duration `json:"op_timeout"`
	// BarrierTimeout bounds the wait for the backend of an operation with an
	// unknown outcome to be gone. Zero: 15 s.
	BarrierTimeout time.Duration `json:"barrier_timeout"`
}

// The statements read clock_timestamp() before the lease function runs (the
// lateral reference to s.t0 forces that order) and after it returns.
const (
	sqlAcquire = `SELECT s.t0, a.acquired, a.epoch, a.expires_at, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0) s
  CROSS JOIN LATERAL lease.acquire(CASE WHEN s.t0 IS NOT NULL THEN $1::text END, $2::text,
       $3::bigint * interval '1 microsecond', $4::bigint * interval '1 microsecond') a`
	sqlRenew = `SELECT s.t0, r.status, r.expires_at, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0) s
  CROSS JOIN LATERAL lease.renew(CASE WHEN s.t0 IS NOT NULL THEN $1::text END, $2::text, $3::bigint,
       $4::bigint * interval '1 microsecond') r`
	sqlRelease = `SELECT s.t0, r.status, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0) s
  CROSS JOIN LATERAL lease.release(CASE WHEN s.t0 IS NOT NULL THEN $1::text END, $2::text, $3::bigint) r(status)`
	sqlInspect = `SELECT s.t0, i.held, i.owner, i.epoch, i.expires_at, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0) s
  LEFT JOIN LATERAL lease.inspect(CASE WHEN s.t0 IS NOT NULL THEN $1::text END) i ON true`
	// The guard: a resource that accepts a write only with an epoch at least
	// as high as the highest it has accepted (one conditional UPDATE).
	sqlGuard = `UPDATE robustness_guard g SET epoch = $2::bigint, writes = g.writes + 1, writer = $3::text
  WHERE g.resource = $1::text AND g.epoch <= $2::bigint RETURNING g.writes, clock_timestamp()`
)

// GuardSchema creates the guard table with one row per key.
func GuardSchema(keys []string) string {
	var b strings.Builder
	b.WriteString(`CREATE TABLE IF NOT EXISTS robustness_guard (resource text PRIMARY KEY, epoch bigint NOT NULL, writes bigint NOT NULL, writer text);` + "\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "INSERT INTO robustness_guard VALUES ('%s', 0, 0, NULL) ON CONFLICT DO NOTHING;\n", strings.ReplaceAll(k, "'", "''"))
	}
	return b.String()
}

type token struct{ epoch int64 }

// pendingOp is an operation with an unknown outcome, waiting for the backend
// that ran it to be seen gone.
type pendingOp struct {
	op      Op
	pid     uint32
	pmStart string
}

type client struct {
	cfg  ClientConfig
	rng  *rand.Rand
	emit func(Op)

	conn    *pgx.Conn
	pid     uint32
	pmStart string
	pending []pendingOp
	seq     int

	held      map[string]token // keys this client believes it holds
	lastEpoch map[string]int64 // last epoch this client had on each key
}

// RunClient runs one client's workload until cfg.Until or ctx ends, calling
// emit for every finished operation (Unknown ones once their backend is gone
// or at the end, with Return = Never).
func RunClient(ctx context.Context, cfg ClientConfig, emit func(Op)) {
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 3 * time.Second
	}
	if cfg.BarrierTimeout == 0 {
		cfg.BarrierTimeout = 15 * time.Second
	}
	c := &client{cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed)), emit: emit,
		held: map[string]token{}, lastEpoch: map[string]int64{}}
	defer func() {
		if c.conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c.conn.Close(cctx)
			cancel()
		}
		for _, p := range c.pending {
			p.op.Return = Never
			c.emit(p.op)
		}
	}()
	for ctx.Err() == nil && Mono() < cfg.Until {
		c.step(ctx)
	}
	if len(c.pending) > 0 {
		c.connect(ctx) // bounded by Until + BarrierTimeout
	}
}

func (c *client) owner() string { return fmt.Sprintf("c%d", c.cfg.ID) }

// connect (re)connects until it succeeds or the run ends, then resolves the
// pending operations whose backend is gone.
func (c *client) connect(ctx context.Context) bool {
	for c.conn == nil {
		if ctx.Err() != nil || Mono() >= c.cfg.Until+int64(c.cfg.BarrierTimeout) {
			return false
		}
		cfg, err := pgx.ParseConfig(c.cfg.DSN)
		if err != nil {
			panic(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		cfg.ConnectTimeout = 2 * time.Second
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err := pgx.ConnectConfig(cctx, cfg)
		if err == nil {
			err = conn.QueryRow(cctx, `SELECT pg_backend_pid(), pg_postmaster_start_time()::text`).Scan(&c.pid, &c.pmStart)
			if err != nil {
				conn.Close(cctx)
			}
		}
		cancel()
		if err != nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		c.conn = conn
	}
	c.resolvePending(ctx)
	return c.conn != nil
}

// resolvePending terminates the backends of pending operations and waits for
// them to be gone: after that, an operation's effect, if any, has happened.
func (c *client) resolvePending(ctx context.Context) {
	var keep []pendingOp
	for i, p := range c.pending {
		if c.conn == nil {
			keep = append(keep, c.pending[i:]...)
			break
		}
		gone, err := c.backendGone(ctx, p)
		if err != nil {
			c.dropConn()
			keep = append(keep, c.pending[i:]...)
			break
		}
		if !gone {
			p.op.Return = Never
		} else {
			p.op.Return = Mono()
		}
		c.emit(p.op)
	}
	c.pending = keep
}

func (c *client) backendGone(ctx context.Context, p pendingOp) (bool, error) {
	if p.pmStart != c.pmStart {
		return true, nil // the server restarted since: every backend of before is gone
	}
	deadline := time.Now().Add(c.cfg.BarrierTimeout)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.OpTimeout)
		var exists bool
		err := c.conn.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1::int)
		  AND pg_terminate_backend($1::int)`, int64(p.pid)).Scan(&exists)
		cancel()
		if err != nil {
			return false, err
		}
		if !exists {
			// Once more: pg_terminate_backend only signals.
			cctx, cancel := context.WithTimeout(ctx, c.cfg.OpTimeout)
			err := c.conn.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1::int)`, int64(p.pid)).Scan(&exists)
			cancel()
			if err != nil {
				return false, err
			}
			if !exists {
				return true, nil
			}
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return false, nil
}

func (c *client) dropConn() {
	if c.conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		c.conn.Close(cctx)
		cancel()
		c.conn = nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// step draws the same number of random values whatever happens, so that a
// client's random stream stays aligned across runs with one seed.
func (c *client) step(ctx context.Context) {
	rKind := c.rng.Float64()
	ki := c.rng.Intn(len(c.cfg.Keys))
	rStale := c.rng.Float64()
	rWait := c.rng.Intn(3)
	think := time.Duration(c.rng.Intn(15)) * time.Millisecond

	if !c.connect(ctx) {
		return
	}
	key := c.cfg.Keys[ki]
	ttl := c.cfg.TTLs[ki]
	// A held key to renew or release: the drawn one if held, else the first
	// held in key order, else the drawn one with a stale epoch.
	heldKey := func() (string, time.Duration, int64) {
		if t, ok := c.held[key]; ok {
			return key, ttl, t.epoch
		}
		for i, k := range c.cfg.Keys {
			if t, ok := c.held[k]; ok {
				return k, c.cfg.TTLs[i], t.epoch
			}
		}
		e := c.lastEpoch[key]
		if e < 1 {
			e = 1
		}
		return key, ttl, e
	}
	perturb := func(e int64) int64 {
		switch {
		case rStale < 0.04 && e > 1:
			return e - 1
		case rStale < 0.08:
			return e + 1
		}
		return e
	}
	switch {
	case rKind < 0.28:
		c.acquire(ctx, key, ttl, 0)
	case rKind < 0.36:
		c.acquire(ctx, key, ttl, []time.Duration{100, 200, 400}[rWait]*time.Millisecond)
	case rKind < 0.62:
		k, kttl, e := heldKey()
		c.renew(ctx, k, kttl, perturb(e))
	case rKind < 0.72:
		k, _, e := heldKey()
		c.release(ctx, k, perturb(e))
	case rKind < 0.93:
		c.inspect(ctx, key)
	default:
		// A zombie write: the last epoch this client had on key, held or not.
		if e := c.lastEpoch[key]; e > 0 {
			c.guard(ctx, key, e)
		}
	}
	sleepCtx(ctx, think)
}

func (c *client) newOp(kind, key string) Op {
	c.seq++
	return Op{Client: c.cfg.ID, Seq: c.seq, Kind: kind, Key: key, Owner: c.owner()}
}

// finish classifies err, records the operation, and returns whether the
// server answered.
func (c *client) finish(op Op, err error) bool {
	op.Return = Mono()
	if err == nil {
		op.Outcome = OK
		c.emit(op)
		return true
	}
	op.Err = err.Error()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "57014" && pgErr.Message == "timeout":
		op.Outcome, op.Status = OK, STimeout
		c.emit(op)
		return true
	case errors.As(err, &pgErr) && pgErr.Severity == "ERROR" && !strings.HasPrefix(pgErr.Code, "57P") && !strings.HasPrefix(pgErr.Code, "08"):
		// The statement failed and its transaction rolled back: no effect.
		op.Outcome = Fail
		c.emit(op)
		return false
	case pgconn.SafeToRetry(err):
		op.Outcome = Fail // never sent
		c.dropConn()
		c.emit(op)
		return false
	}
	op.Outcome = Unknown
	op.Failed = op.Return
	op.Return = Never
	c.pending = append(c.pending, pendingOp{op: op, pid: c.pid, pmStart: c.pmStart})
	c.dropConn()
	return false
}

func (c *client) opCtx(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.cfg.OpTimeout+extra)
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func (c *client) acquire(ctx context.Context, key string, ttl, wait time.Duration) {
	kind := KAcquire
	if wait > 0 {
		kind = KAcquireWait
	}
	op := c.newOp(kind, key)
	op.TTL, op.Wait = ttl.Microseconds(), wait.Microseconds()
	var (
		t0, t1   time.Time
		acquired bool
		epoch    *int64
		exp      *time.Time
	)
	cctx, cancel := c.opCtx(ctx, wait)
	op.Call = Mono()
	err := c.conn.QueryRow(cctx, sqlAcquire, key, op.Owner, op.TTL, op.Wait).Scan(&t0, &acquired, &epoch, &exp, &t1)
	cancel()
	if err == nil {
		op.T0, op.T1 = micros(t0), micros(t1)
		if acquired && epoch != nil && exp != nil {
			op.Status, op.OutEpoch, op.Expires = SGranted, *epoch, micros(*exp)
		} else {
			op.Status = SDenied
			if exp != nil {
				op.GraceUntil = micros(*exp)
			}
		}
	}
	if c.finish(op, err) && op.Status == SGranted {
		c.held[key] = token{op.OutEpoch}
		c.lastEpoch[key] = op.OutEpoch
		c.guard(ctx, key, op.OutEpoch)
	}
}

func (c *client) renew(ctx context.Context, key string, ttl time.Duration, epoch int64) {
	op := c.newOp(KRenew, key)
	op.TTL, op.Epoch = ttl.Microseconds(), epoch
	var (
		t0, t1 time.Time
		status string
		exp    *time.Time
	)
	cctx, cancel := c.opCtx(ctx, 0)
	op.Call = Mono()
	err := c.conn.QueryRow(cctx, sqlRenew, key, op.Owner, epoch, op.TTL).Scan(&t0, &status, &exp, &t1)
	cancel()
	if err == nil {
		op.T0, op.T1, op.Status = micros(t0), micros(t1), status
		if exp != nil {
			op.Expires = micros(*exp)
		}
	}
	answered := c.finish(op, err)
	switch {
	case answered && op.Status == SOk:
		c.held[key] = token{epoch}
		c.lastEpoch[key] = epoch
		c.guard(ctx, key, epoch) // every successful renew is followed by a fenced write
	case answered:
		if t, ok := c.held[key]; ok && t.epoch == epoch {
			delete(c.held, key)
		}
	}
}

func (c *client) release(ctx context.Context, key string, epoch int64) {
	op := c.newOp(KRelease, key)
	op.Epoch = epoch
	var (
		t0, t1 time.Time
		status string
	)
	cctx, cancel := c.opCtx(ctx, 0)
	op.Call = Mono()
	err := c.conn.QueryRow(cctx, sqlRelease, key, op.Owner, epoch).Scan(&t0, &status, &t1)
	cancel()
	if err == nil {
		op.T0, op.T1, op.Status = micros(t0), micros(t1), status
	}
	if c.finish(op, err) {
		if t, ok := c.held[key]; ok && t.epoch == epoch {
			delete(c.held, key)
		}
	}
}

func (c *client) inspect(ctx context.Context, key string) {
	op := c.newOp(KInspect, key)
	var (
		t0, t1 time.Time
		held   *bool
		owner  *string
		epoch  *int64
		exp    *time.Time
	)
	cctx, cancel := c.opCtx(ctx, 0)
	op.Call = Mono()
	err := c.conn.QueryRow(cctx, sqlInspect, key).Scan(&t0, &held, &owner, &epoch, &exp, &t1)
	cancel()
	if err == nil {
		op.T0, op.T1 = micros(t0), micros(t1)
		switch {
		case held == nil:
			op.Status = SAbsent
		case *held:
			op.Status = SHeld
			if owner != nil {
				op.OutOwner = *owner
			}
			if exp != nil {
				op.Expires = micros(*exp)
			}
		default:
			op.Status = SFree
		}
		if epoch != nil {
			op.OutEpoch = *epoch
		}
	}
	c.finish(op, err)
}

func (c *client) guard(ctx context.Context, key string, epoch int64) {
	if c.conn == nil {
		return
	}
	op := c.newOp(KGuard, key)
	op.Epoch = epoch
	var (
		writes int64
		t1     time.Time
	)
	cctx, cancel := c.opCtx(ctx, 0)
	op.Call = Mono()
	err := c.conn.QueryRow(cctx, sqlGuard, key, epoch, op.Owner).Scan(&writes, &t1)
	cancel()
	switch {
	case err == nil:
		op.Status, op.GuardSeq, op.T1 = SAccepted, writes, micros(t1)
	case errors.Is(err, pgx.ErrNoRows):
		op.Status, err = SRejected, nil
	}
	c.finish(op, err)
}

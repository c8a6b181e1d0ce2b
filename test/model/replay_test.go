package model_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The model's time: 10 units are one hour of the server's clock. The replay
// moves the server's clock (libfaketime) to the model's time at each tick, so
// every instant the model compares is an hour's multiple apart from another,
// and the seconds the replay itself takes never change a comparison.
const unit = 6 * time.Minute

// The key, and the model's clients: each is an owner string and a role
// (b was granted a), as in specs/model/pglease.qnt.
const key = "k"

var clientRole = map[string]string{"c1": "a", "c2": "b", "c3": "a"}

const (
	envSeed   = "PGLEASE_MODEL_SEED"
	envTraces = "PGLEASE_MODEL_TRACES"
	envSteps  = "PGLEASE_MODEL_STEPS"
	envSQL    = "PGLEASE_MODEL_SQL"
)

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// obs is the model's lastObs: the call a step made and what it answered.
type obs struct {
	Kind   string
	Client string
	TTL    int64
	Wait   int64
	Arg    int64
	Sarg   string
	Err    string
	OK     bool
	Status string
	Epoch  *big.Int
	Exp    int64
	Owner  string
}

// view is what lease.inspect shows of the model's primary after the step.
type view struct {
	Exists bool
	Held   bool
	Owner  string
	Epoch  *big.Int
	Exp    int64
}

type state struct {
	Now  int64
	Obs  obs
	View view
}

const none = -1

// itfValue decodes an ITF value: {"#bigint": "..."}, records, maps, sets.
func itfInt(raw json.RawMessage) (*big.Int, error) {
	var b struct {
		Big string `json:"#bigint"`
	}
	if err := json.Unmarshal(raw, &b); err == nil && b.Big != "" {
		n, ok := new(big.Int).SetString(b.Big, 10)
		if !ok {
			return nil, fmt.Errorf("bad #bigint %q", b.Big)
		}
		return n, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("not an integer: %s", raw)
	}
	v, ok := new(big.Int).SetString(n.String(), 10)
	if !ok {
		return nil, fmt.Errorf("not an integer: %s", raw)
	}
	return v, nil
}

type record map[string]json.RawMessage

func (r record) int(name string) int64 {
	n, err := itfInt(r[name])
	if err != nil {
		panic(fmt.Sprintf("field %s: %v", name, err))
	}
	return n.Int64()
}

func (r record) big(name string) *big.Int {
	n, err := itfInt(r[name])
	if err != nil {
		panic(fmt.Sprintf("field %s: %v", name, err))
	}
	return n
}

func (r record) str(name string) string {
	var s string
	if err := json.Unmarshal(r[name], &s); err != nil {
		panic(fmt.Sprintf("field %s: %v", name, err))
	}
	return s
}

func (r record) bool(name string) bool {
	var b bool
	if err := json.Unmarshal(r[name], &b); err != nil {
		panic(fmt.Sprintf("field %s: %v", name, err))
	}
	return b
}

func (r record) rec(name string) record {
	var x record
	if err := json.Unmarshal(r[name], &x); err != nil {
		panic(fmt.Sprintf("field %s: %v", name, err))
	}
	return x
}

// rowOf reads the key's row from the rows map of a Db record (nil: none).
func rowOf(db record) record {
	var m struct {
		Map [][2]json.RawMessage `json:"#map"`
	}
	if err := json.Unmarshal(db["rows"], &m); err != nil {
		panic(fmt.Sprintf("rows: %v", err))
	}
	for _, kv := range m.Map {
		var k string
		if json.Unmarshal(kv[0], &k) == nil && k == key {
			var r record
			if err := json.Unmarshal(kv[1], &r); err != nil {
				panic(err)
			}
			return r
		}
	}
	return nil
}

// readTrace reads one ITF trace of the model's replay configuration.
func readTrace(path string) ([]state, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var tr struct {
		States []map[string]json.RawMessage `json:"states"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []state
	for _, s := range tr.States {
		vars := record{}
		for k, v := range s {
			if k == "#meta" {
				continue
			}
			vars[k[strings.LastIndex(k, "::")+2:]] = v
		}
		var st state
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("%s: state %d: %v", path, len(out), r)
				}
			}()
			st.Now = vars.int("now")
			o := vars.rec("lastObs")
			st.Obs = obs{Kind: o.str("kind"), Client: o.str("client"), TTL: o.int("ttl"), Wait: o.int("wait"),
				Arg: o.int("arg"), Sarg: o.str("sarg"), Err: o.str("err"), OK: o.bool("ok"),
				Status: o.str("status"), Epoch: o.big("epoch"), Exp: o.int("exp"), Owner: o.str("owner")}
			db := vars.rec("primary").rec("db")
			t := st.Now + vars.int("skew")
			if r := rowOf(db); r != nil {
				st.View.Exists = true
				st.View.Epoch = r.big("epoch")
				st.View.Exp = none
				if r.str("owner") != "" && r.int("expires") > t {
					st.View.Held, st.View.Owner, st.View.Exp = true, r.str("owner"), r.int("expires")
				}
			}
		}()
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// quint runs the model's command line from specs/model/node_modules.
func quintTraces(t *testing.T, seed, traces, steps int) []string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "specs", "model")
	cli := filepath.Join(dir, "node_modules", "@informalsystems", "quint", "dist", "src", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("the Quint tool is not installed in specs/model: run `npm ci --prefix specs/model` (make test does): %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command("node", cli, "run", "--backend=typescript", "--main=replay",
		"--seed="+strconv.Itoa(seed), "--max-steps="+strconv.Itoa(steps),
		"--max-samples="+strconv.Itoa(traces), "--n-traces="+strconv.Itoa(traces),
		"--invariants", "noEpochTwice", "oneBeliever", "handoverToActable", "freeKeyGranted",
		"--out-itf="+filepath.Join(out, "trace_{seq}.itf.json"), "main.qnt")
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quint run: %v\n%s", err, b)
	}
	paths, err := filepath.Glob(filepath.Join(out, "trace_*.itf.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("quint run wrote no trace (%v):\n%s", err, b)
	}
	sort.Strings(paths)
	return paths
}

func TestReplayModelTraces(t *testing.T) {
	seed := envInt(t, envSeed, 20261207)
	n := envInt(t, envTraces, 3)
	steps := envInt(t, envSteps, 20)
	paths := quintTraces(t, seed, n, steps)

	srv := pgtest.New(t, pgtest.Options{FakeClock: true})
	ctx := pgtest.Context(t, 10*time.Minute)
	if os.Getenv(envSQL) == "" {
		if err := srv.InstallExtensionFiles(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []string{"model_a", "model_b"} {
		if err := srv.CreateRole(ctx, r, "LOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	admin := pgtest.Connect(t, srv.DSN())
	if _, err := admin.Exec(ctx, `GRANT model_a TO model_b`); err != nil {
		t.Fatal(err)
	}
	r := &replayer{t: t, srv: srv}
	for i, p := range paths {
		tr, err := readTrace(p)
		if err != nil {
			t.Fatal(err)
		}
		r.run(ctx, fmt.Sprintf("model%d", i), tr, fmt.Sprintf("seed %d, trace %d of %d, %d steps", seed, i, n, steps))
	}
}

type result struct {
	ok     *bool
	epoch  *int64
	exp    *time.Time
	status *string
	err    error
}

type replayer struct {
	t   *testing.T
	srv *pgtest.Server
	dsn string

	// offset: the server clock's offset from real time at model time 0
	offset     time.Duration
	serverZero time.Time // the server's clock at model time 0, read at the trace's start
	realZero   time.Time // real time then
	conns      map[string]*pgx.Conn
	admin      *pgx.Conn
	waiting    chan result
	log        []string
}

func (r *replayer) connect(ctx context.Context) {
	r.t.Helper()
	r.conns = map[string]*pgx.Conn{}
	for c, role := range clientRole {
		conn, err := pgx.Connect(ctx, pgtest.WithUser(r.dsn, "model_"+role))
		if err != nil {
			r.t.Fatal(err)
		}
		r.conns[c] = conn
	}
	var err error
	if r.admin, err = pgx.Connect(ctx, r.dsn); err != nil {
		r.t.Fatal(err)
	}
}

func (r *replayer) close() {
	for _, c := range r.conns {
		c.Close(context.Background())
	}
	if r.admin != nil {
		r.admin.Close(context.Background())
	}
}

// run replays one trace on a database of its own.
func (r *replayer) run(ctx context.Context, db string, tr []state, what string) {
	t := r.t
	var err error
	if r.dsn, err = r.srv.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	r.connect(ctx)
	defer r.close()
	if file := os.Getenv(envSQL); file != "" {
		if _, err := r.admin.Exec(ctx, "BEGIN; "+pgtest.ScriptFile(t, file, envSQL)+"; COMMIT"); err != nil {
			t.Fatalf("installing %s=%s: %v", envSQL, file, err)
		}
	} else if _, err := r.admin.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	// The model starts with max_ttl 20 units (2 hours).
	if _, err := r.admin.Exec(ctx, "SELECT lease.configure(max_ttl => '2 hours')"); err != nil {
		t.Fatal(err)
	}
	// The clock never goes back: each trace starts where the last one left it.
	if err := r.srv.SetClockOffset(r.offset); err != nil {
		t.Fatal(err)
	}
	if err := r.admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&r.serverZero); err != nil {
		t.Fatal(err)
	}
	r.realZero = time.Now()
	base := r.offset
	r.log = []string{what}
	for i := 1; i < len(tr); i++ {
		s := tr[i]
		r.log = append(r.log, fmt.Sprintf("%3d  t=%-4d %s", i, s.Now, describe(s.Obs)))
		if msg := r.step(ctx, s, base); msg != "" {
			t.Fatalf("the SQL and the model differ at step %d: %s\ntrace (%s):\n%s", i, msg, what, strings.Join(r.log, "\n"))
		}
		if msg := r.inspect(ctx, s); msg != "" {
			t.Fatalf("lease.inspect after step %d differs from the model: %s\ntrace (%s):\n%s", i, msg, what, strings.Join(r.log, "\n"))
		}
		r.offset = base + time.Duration(s.Now)*unit
	}
	if r.waiting != nil {
		// a blocking acquire still waiting at the trace's end: the model has
		// no answer for it; closing its connection ends it
		r.close()
		<-r.waiting
		r.waiting = nil
	}
	r.offset += time.Hour
	t.Logf("%s: %d steps replayed", what, len(tr)-1)
}

func describe(o obs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", o.Kind)
	if o.Client != "" {
		fmt.Fprintf(&b, " %s", o.Client)
	}
	switch o.Kind {
	case "acquire", "wait_end":
		fmt.Fprintf(&b, " ttl=%d -> ok=%v epoch=%v exp=%d err=%q", o.TTL, o.OK, o.Epoch, o.Exp, o.Err)
	case "wait_start":
		fmt.Fprintf(&b, " ttl=%d wait=%d", o.TTL, o.Wait)
	case "renew":
		fmt.Fprintf(&b, " epoch=%d ttl=%d -> %s exp=%d err=%q", o.Arg, o.TTL, o.Status, o.Exp, o.Err)
	case "release":
		fmt.Fprintf(&b, " epoch=%d -> %s", o.Arg, o.Status)
	case "candidate":
		fmt.Fprintf(&b, " priority=%d version=%q", o.Arg, o.Sarg)
	case "set_strategy":
		fmt.Fprintf(&b, " %s (previous %s)", o.Sarg, o.Status)
	case "configure":
		fmt.Fprintf(&b, " max_ttl=%d promotion=%q -> grace %d", o.Arg, o.Sarg, o.Exp)
	case "cleanup":
		fmt.Fprintf(&b, " -> removed %d, floor %v", o.Arg, o.Epoch)
	case "tick":
		fmt.Fprintf(&b, " +%d", o.Arg)
	}
	return b.String()
}

func interval(units int64) string {
	return strconv.FormatInt(units*int64(unit/time.Second), 10) + " seconds"
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// at is the server instant of model time m, within what the replay has taken
// so far: [serverZero + m units, serverZero + m units + elapsed].
func (r *replayer) checkInstant(what string, m int64, got *time.Time) string {
	if m == none {
		if got != nil {
			return fmt.Sprintf("%s: got %s, the model says NULL", what, got.Format(time.RFC3339Nano))
		}
		return ""
	}
	if got == nil {
		return fmt.Sprintf("%s: got NULL, the model says t=%d", what, m)
	}
	want := r.serverZero.Add(time.Duration(m) * unit)
	d := got.Sub(want)
	if d < -time.Second || d > time.Since(r.realZero)+time.Second {
		return fmt.Sprintf("%s: got %s, the model says t=%d (%s, give or take the replay's %s)",
			what, got.Format(time.RFC3339Nano), m, want.Format(time.RFC3339Nano), time.Since(r.realZero).Round(time.Millisecond))
	}
	return ""
}

func checkEpoch(what string, want *big.Int, got *int64) string {
	if want.Sign() < 0 {
		if got != nil {
			return fmt.Sprintf("%s: got epoch %d, the model says NULL", what, *got)
		}
		return ""
	}
	if got == nil || big.NewInt(*got).Cmp(want) != 0 {
		g := "NULL"
		if got != nil {
			g = strconv.FormatInt(*got, 10)
		}
		return fmt.Sprintf("%s: got epoch %s, the model says %s", what, g, want)
	}
	return ""
}

func checkErr(what, want string, err error) string {
	if want == "" {
		if err != nil {
			return fmt.Sprintf("%s: error %v, the model says none", what, err)
		}
		return ""
	}
	if got := sqlstate(err); got != want {
		return fmt.Sprintf("%s: got error %v (SQLSTATE %q), the model says SQLSTATE %s", what, err, got, want)
	}
	return ""
}

func (r *replayer) acquireResult(o obs, res result) string {
	if msg := checkErr(o.Kind, o.Err, res.err); msg != "" || o.Err != "" {
		return msg
	}
	if *res.ok != o.OK {
		return fmt.Sprintf("%s: acquired %v, the model says %v", o.Kind, *res.ok, o.OK)
	}
	if msg := checkEpoch(o.Kind, o.Epoch, res.epoch); msg != "" {
		return msg
	}
	return r.checkInstant(o.Kind+" expires_at", o.Exp, res.exp)
}

func (r *replayer) step(ctx context.Context, s state, base time.Duration) string {
	o := s.Obs
	conn := r.conns[o.Client]
	switch o.Kind {
	case "acquire":
		var res result
		res.err = conn.QueryRow(ctx, `SELECT acquired, epoch, expires_at FROM lease.acquire($1, $2, $3::interval)`,
			key, o.Client, interval(o.TTL)).Scan(&res.ok, &res.epoch, &res.exp)
		return r.acquireResult(o, res)
	case "wait_start":
		ch := make(chan result, 1)
		r.waiting = ch
		go func() {
			var res result
			res.err = conn.QueryRow(ctx, `SELECT acquired, epoch, expires_at FROM lease.acquire($1, $2, $3::interval, $4::interval)`,
				key, o.Client, interval(o.TTL), interval(o.Wait)).Scan(&res.ok, &res.epoch, &res.exp)
			ch <- res
		}()
		return ""
	case "wait_end":
		if r.waiting == nil {
			return "wait_end without a blocking acquire in flight"
		}
		select {
		case res := <-r.waiting:
			r.waiting = nil
			return r.acquireResult(o, res)
		case <-time.After(time.Minute):
			return "the blocking acquire did not end within a minute"
		}
	case "renew":
		var status *string
		var exp *time.Time
		err := conn.QueryRow(ctx, `SELECT status, expires_at FROM lease.renew($1, $2, $3, $4::interval)`,
			key, o.Client, o.Arg, interval(o.TTL)).Scan(&status, &exp)
		if msg := checkErr("renew", o.Err, err); msg != "" || o.Err != "" {
			return msg
		}
		if status == nil || *status != o.Status {
			return fmt.Sprintf("renew: status %v, the model says %s", deref(status), o.Status)
		}
		return r.checkInstant("renew expires_at", o.Exp, exp)
	case "release":
		var status string
		if err := conn.QueryRow(ctx, `SELECT lease.release($1, $2, $3)`, key, o.Client, o.Arg).Scan(&status); err != nil {
			return fmt.Sprintf("release: %v", err)
		}
		if status != o.Status {
			return fmt.Sprintf("release: status %s, the model says %s", status, o.Status)
		}
		return ""
	case "candidate":
		var version *string
		if o.Sarg != "" {
			version = &o.Sarg
		}
		var status string
		var exp *time.Time
		if err := conn.QueryRow(ctx, `SELECT status, expires_at FROM lease.candidate($1, $2, $3::interval, $4, $5::int)`,
			key, o.Client, interval(o.TTL), version, o.Arg).Scan(&status, &exp); err != nil {
			return fmt.Sprintf("candidate: %v", err)
		}
		if status != o.Status {
			return fmt.Sprintf("candidate: status %s, the model says %s", status, o.Status)
		}
		return r.checkInstant("candidate expires_at", o.Exp, exp)
	case "set_strategy":
		var prev string
		if err := conn.QueryRow(ctx, `SELECT lease.set_strategy($1, $2)`, key, o.Sarg).Scan(&prev); err != nil {
			return fmt.Sprintf("set_strategy: %v", err)
		}
		if prev != o.Status {
			return fmt.Sprintf("set_strategy: previous %s, the model says %s", prev, o.Status)
		}
		return ""
	case "configure":
		var maxTTL, promotion *string
		if o.Arg > 0 {
			v := interval(o.Arg)
			maxTTL = &v
		}
		if o.Sarg != "" {
			promotion = &o.Sarg
		}
		var grace float64
		if err := r.admin.QueryRow(ctx, `SELECT extract(epoch FROM promotion_grace)::float8 FROM lease.configure($1::interval, $2)`,
			maxTTL, promotion).Scan(&grace); err != nil {
			return fmt.Sprintf("configure: %v", err)
		}
		if want := float64(o.Exp) * unit.Seconds(); grace != want {
			return fmt.Sprintf("configure: promotion_grace %v s, the model says %v s", grace, want)
		}
		return ""
	case "cleanup":
		var removed, floor int64
		if err := r.admin.QueryRow(ctx, `SELECT removed, epoch_floor FROM lease.cleanup('0')`).Scan(&removed, &floor); err != nil {
			return fmt.Sprintf("cleanup: %v", err)
		}
		if removed != o.Arg {
			return fmt.Sprintf("cleanup: removed %d, the model says %d", removed, o.Arg)
		}
		return checkEpoch("cleanup's floor", o.Epoch, &floor)
	case "tick":
		if err := r.srv.SetClockOffset(base + time.Duration(s.Now)*unit); err != nil {
			return err.Error()
		}
		return ""
	case "restart":
		if r.waiting != nil {
			return "restart with a blocking acquire in flight"
		}
		r.close()
		if err := r.srv.Restart(ctx); err != nil {
			return "restart: " + err.Error()
		}
		r.connect(ctx)
		return ""
	}
	return "a step the replay does not know: " + o.Kind
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// inspect compares lease.inspect with the model's primary after a step.
func (r *replayer) inspect(ctx context.Context, s state) string {
	rows, err := r.admin.Query(ctx, `SELECT held, owner, epoch, expires_at FROM lease.inspect($1)`, key)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err.Error()
		}
		if s.View.Exists {
			return "no row, the model has one"
		}
		return ""
	}
	var held bool
	var owner *string
	var epoch *int64
	var exp *time.Time
	if err := rows.Scan(&held, &owner, &epoch, &exp); err != nil {
		return err.Error()
	}
	if !s.View.Exists {
		return fmt.Sprintf("a row (held %v, epoch %v), the model has none", held, deref64(epoch))
	}
	if held != s.View.Held {
		return fmt.Sprintf("held %v, the model says %v", held, s.View.Held)
	}
	if held && deref(owner) != s.View.Owner {
		return fmt.Sprintf("owner %s, the model says %s", deref(owner), s.View.Owner)
	}
	if msg := checkEpoch("inspect", s.View.Epoch, epoch); msg != "" {
		return msg
	}
	return r.checkInstant("inspect expires_at", s.View.Exp, exp)
}

func deref64(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return strconv.FormatInt(*p, 10)
}

package failure

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/internal/testprog"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Holder session terminates (pg_terminate_backend, or the client closes its
// connection): the grant neither vanishes nor frees; it stays held until its
// expiry, and then another owner takes over.
func TestHolderSessionTerminated(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	admin := e.connect(t)
	for _, how := range []string{"pg_terminate_backend", "disconnect"} {
		t.Run(how, func(t *testing.T) {
			ctx := pgtest.Context(t, time.Minute)
			key := "k-" + how
			holderConn := e.connect(t)
			g := mustAcquire(t, lease.New(holderConn), key, "holder", time.Second)
			pid := holderConn.PgConn().PID()
			if how == "disconnect" {
				if err := holderConn.Close(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				var ok bool
				if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int64(pid)).Scan(&ok); err != nil || !ok {
					t.Fatalf("pg_terminate_backend: %t %v", ok, err)
				}
			}
			backendGone(t, admin, pid)

			other := e.client(t)
			observer := e.client(t)
			if _, ok, err := other.Acquire(ctx, key, "other", time.Minute); err != nil || ok {
				t.Fatalf("another owner's acquire right after the holder's session ended: ok=%t err=%v (want denied: the grant must not vanish)", ok, err)
			}
			// Held, unchanged, at every observation until the expiry; then lapsed.
			samples := 0
			for {
				s := inspect(t, observer, key)
				samples++
				if s.ServerNow.Before(g.ExpiresAt) {
					if !s.Held || s.Owner != "holder" || s.Epoch != g.Epoch || !s.ExpiresAt.Equal(g.ExpiresAt) {
						t.Fatalf("at server time %s, before the expiry %s: %s (want held by holder, epoch %d)",
							s.ServerNow.Format(time.RFC3339Nano), g.ExpiresAt.Format(time.RFC3339Nano), stateString(s), g.Epoch)
					}
				} else if !s.Held {
					break
				} else if s.ServerNow.Sub(g.ExpiresAt) > time.Millisecond {
					// (within 1 ms: ServerNow is read after inspect's own clock reading)
					t.Fatalf("still held at server time %s, after its expiry %s", s.ServerNow.Format(time.RFC3339Nano), g.ExpiresAt.Format(time.RFC3339Nano))
				}
				if samples > 10000 {
					t.Fatal("never lapsed")
				}
				time.Sleep(20 * time.Millisecond)
			}
			g2, ok, err := other.Acquire(ctx, key, "other", time.Minute)
			if err != nil || !ok || g2.Epoch != g.Epoch+1 {
				t.Fatalf("takeover after expiry: %v ok=%t err=%v, want epoch %d", g2.Token, ok, err, g.Epoch+1)
			}
			t.Logf("%s: held through %d observations until expiry, then taken over at epoch %d", how, samples, g2.Epoch)
		})
	}
}

// proc is a running holder process (the candidate program in holder mode,
// internal/testprog/candidate) and the lines it printed, each event
// rendered as "acquired 1", "renew ok 1", "renew lapsed", "write 1
// accepted", "fence 1 lapsed", "done".
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	seen  []string
}

func render(e testprog.Event) string {
	switch e.Ev {
	case "acquired":
		return fmt.Sprintf("acquired %d", e.Epoch)
	case "renew":
		if e.Status == "ok" {
			return fmt.Sprintf("renew ok %d", e.Epoch)
		}
		if e.Status == "error" {
			return "renew error " + e.Err
		}
		return "renew " + e.Status
	case "write", "fence":
		l := fmt.Sprintf("%s %d %s", e.Ev, e.Epoch, e.Status)
		if e.Err != "" {
			l += " " + e.Err
		}
		return l
	case "error":
		return "error " + e.Err
	}
	return e.Ev
}

// startHolder starts a holder on key "res" of dsn; guard is strict or
// broken.
func startHolder(t *testing.T, dsn, owner, ttl, every, guard string) *proc {
	t.Helper()
	cmd := exec.Command(pgtest.BuildProgram(t, testprog.CandidatePkg))
	cmd.Env = append(os.Environ(), "PGLEASE_TC_MODE=holder", "PGLEASE_TC_DSN="+dsn, "PGLEASE_TC_KEY=res",
		"PGLEASE_TC_ID="+owner, "PGLEASE_TC_TTL="+ttl, "PGLEASE_TC_EVERY="+every, "PGLEASE_TC_GUARD="+guard)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 10000)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e testprog.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				p.lines <- "unparsed " + sc.Text()
				continue
			}
			p.lines <- render(e)
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		for range p.lines { // drain until the pipe closes
		}
		_ = cmd.Wait()
	})
	return p
}

// next returns the next line, failing after d.
func (p *proc) next(t *testing.T, d time.Duration) (string, bool) {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if ok {
			p.seen = append(p.seen, l)
		}
		return l, ok
	case <-time.After(d):
		t.Fatalf("helper printed nothing for %v; so far:\n%s", d, strings.Join(p.seen, "\n"))
		return "", false
	}
}

// until reads lines until one equals want, returning the lines read.
func (p *proc) until(t *testing.T, want string, d time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(d)
	for {
		l, ok := p.next(t, time.Until(deadline))
		if !ok {
			t.Fatalf("helper exited before printing %q; it printed:\n%s", want, strings.Join(p.seen, "\n"))
		}
		got = append(got, l)
		if l == want {
			return got
		}
	}
}

func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// Holder hangs (a real process, frozen with SIGSTOP) while its grant
// lapses and another owner takes over. After SIGCONT its renew says lapsed,
// and its old epoch is rejected by an epoch watermark guard and by
// lease.fence: no write under the old epoch lands after the successor's.
func TestHolderHungProcess(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := pgtest.Context(t, 2*time.Minute)
	admin := e.connect(t)
	if _, err := admin.Exec(ctx, `
		CREATE TABLE guard (resource text PRIMARY KEY, epoch bigint NOT NULL);
		CREATE TABLE effects (id bigserial PRIMARY KEY, resource text NOT NULL, epoch bigint NOT NULL,
		                      writer text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
		INSERT INTO guard VALUES ('res', 0)`); err != nil {
		t.Fatal(err)
	}
	brokenGuard := breakIs(t, "guard_no_epoch_check")
	guardMode := "strict"
	if brokenGuard {
		guardMode = "broken"
	}
	p := startHolder(t, e.dsn, "hung", "1s", "200ms", guardMode)
	p.until(t, "acquired 1", 30*time.Second)
	p.until(t, "write 1 accepted", 10*time.Second)
	p.until(t, "write 1 accepted", 10*time.Second)

	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, 10*time.Second, "the helper to stop", func() bool { return procState(pid) == 'T' })
	stoppedAt := time.Now()

	succ := e.connect(t)
	sc := lease.New(succ)
	lapsed := pgtest.WaitLapsed(t, sc, "res", 30*time.Second)
	g2, ok, err := sc.Acquire(ctx, "res", "successor", time.Minute)
	if err != nil || !ok {
		t.Fatalf("successor's acquire after the lapse: ok=%t err=%v", ok, err)
	}
	if g2.Epoch <= 1 {
		t.Errorf("successor's epoch %d is not above the hung holder's 1", g2.Epoch)
	}
	t.Logf("holder frozen; lapsed (epoch counter %d) %v later; successor holds epoch %d",
		lapsed.Epoch, time.Since(stoppedAt).Round(time.Millisecond), g2.Epoch)
	// The successor writes through the same guard, and a fenced write.
	q := `UPDATE guard SET epoch = $2 WHERE resource = $1 AND epoch <= $2`
	if brokenGuard {
		q = `UPDATE guard SET epoch = $2 WHERE resource = $1`
	}
	if err := pgx.BeginFunc(ctx, succ, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, q, "res", g2.Epoch)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("the successor's guarded write was rejected")
		}
		if _, err := lease.Fence(ctx, tx, g2.Token); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO effects (resource, epoch, writer) VALUES ('res', $1, 'successor')`, g2.Epoch)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	after := p.until(t, "done", 30*time.Second)
	t.Logf("after SIGCONT the helper printed: %q", after)
	has := func(l string) bool {
		for _, x := range after {
			if x == l {
				return true
			}
		}
		return false
	}
	if !has("renew lapsed") {
		t.Errorf("the hung holder's renew after SIGCONT did not say lapsed: %q", after)
	}
	if has("write 1 accepted") {
		t.Errorf("the guard accepted a write under the hung holder's epoch 1 after the successor's epoch %d: %q", g2.Epoch, after)
	}
	if !has("write 1 rejected") {
		t.Errorf("no guarded write of the hung holder was rejected: %q", after)
	}
	if !has("fence 1 lapsed") {
		t.Errorf("lease.fence did not reject the hung holder with lapsed: %q", after)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("helper: %v", err)
	}

	// The effects, in commit order, never go back to an older epoch.
	rows, err := admin.Query(ctx, `SELECT epoch, writer FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type effect struct {
		Epoch  int64
		Writer string
	}
	effs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(effs); i++ {
		if effs[i].Epoch < effs[i-1].Epoch {
			t.Errorf("effect %d by %s under epoch %d landed after effect %d by %s under epoch %d: %v",
				i, effs[i].Writer, effs[i].Epoch, i-1, effs[i-1].Writer, effs[i-1].Epoch, effs)
		}
	}
	var wm int64
	if err := admin.QueryRow(ctx, `SELECT epoch FROM guard WHERE resource = 'res'`).Scan(&wm); err != nil {
		t.Fatal(err)
	}
	if wm != g2.Epoch {
		t.Errorf("guard watermark %d, want the successor's epoch %d", wm, g2.Epoch)
	}
}

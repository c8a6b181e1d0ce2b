// Command pglease-demo (make demo) shows leader election through pg_lease
// with fencing, end to end, on a throwaway PostgreSQL:
//
//  1. three candidate processes elect a leader through one lease key; the
//     leader writes to a store guarded by the highest epoch it has accepted;
//  2. the leader is killed (SIGKILL): another candidate takes over with a
//     higher epoch once the lease lapses;
//  3. the new leader is frozen (SIGSTOP) in the middle of a write, past its
//     TTL: the third candidate takes over and writes; the frozen one resumes
//     (SIGCONT), finishes its write with its old epoch, and the guard rejects
//     it;
//  4. everything is stopped and removed.
//
// The candidates are this same program re-executed as the test suites'
// candidate (internal/testprog/candidate, with PGLEASE_TESTCANDIDATE set).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgserver"
	"github.com/pglease/pg_lease/internal/testprog"
	tc "github.com/pglease/pg_lease/internal/testprog/candidate"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

const (
	key = "demo-leader"
	ttl = 2 * time.Second
)

func main() {
	if os.Getenv(testprog.EnvVar) != "" {
		tc.Main() // exits
	}
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s (no arguments)\n"+
			"Starts a throwaway PostgreSQL and three candidates that elect a leader through pg_lease.\n", os.Args[0])
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := demo(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pglease-demo:", err)
		os.Exit(1)
	}
}

// line is one line a candidate printed.
type line struct {
	who    string
	kind   string // LEADING, WORKING, WRITE-OK, WRITE-REJECTED, STOPPED, ...
	epoch  int64
	detail string
}

type candidate struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func demo(ctx context.Context, out io.Writer) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%6.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	say("starting a throwaway PostgreSQL (initdb into a temporary directory)")
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return err
	}
	defer func() {
		srv.Close()
		say("throwaway PostgreSQL stopped and removed")
	}()
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		return err
	}
	dsn, err := srv.CreateDatabase(ctx, "leases")
	if err != nil {
		return err
	}
	storeDSN, err := srv.CreateDatabase(ctx, "store")
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// Warm each new connection: a handoff's first acquire and release then
	// cost what later ones do (no PL/pgSQL compile, no statement prepare).
	pcfg.AfterConnect = lease.WarmConn
	// Never acknowledge a change whose wait for the synchronous standbys was
	// cancelled (lease.ErrCommitUnknown).
	lease.ObserveCommits(&pcfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := leaseadmin.InstallExtension(ctx, pool); err != nil {
		return err
	}
	scfg, err := pgxpool.ParseConfig(storeDSN)
	if err != nil {
		return err
	}
	// A fenced write whose commit's wait for the synchronous standbys was
	// cancelled is lease.ErrCommitUnknown, not success (pkg/fence).
	lease.ObserveCommits(&scfg.ConnConfig.Config)
	// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
	lease.LeashSilentHostsPool(scfg)
	store, err := pgxpool.NewWithConfig(ctx, scfg)
	if err != nil {
		return err
	}
	defer store.Close()
	guard, err := fence.NewPGGuard(store, fence.PGGuardOptions{})
	if err != nil {
		return err
	}
	if err := guard.EnsureTable(ctx); err != nil {
		return err
	}
	if _, err := store.Exec(ctx, "CREATE TABLE writes (epoch bigint, owner text)"); err != nil {
		return err
	}
	say("PostgreSQL %d on 127.0.0.1, pg_lease %s installed; the store is another database, guarded by the highest epoch it accepted", srv.MajorVersion(), leaseadmin.Version)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	lines := make(chan line, 100)
	var cands []*candidate
	defer func() {
		for _, c := range cands {
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cands {
			select {
			case <-c.done:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}
	}()
	for _, name := range []string{"alpha", "bravo", "charlie"} {
		c, err := startCandidate(self, name, dsn, storeDSN, lines)
		if err != nil {
			return err
		}
		cands = append(cands, c)
	}
	say("started 3 candidate processes (alpha, bravo, charlie) for key %q, TTL %v", key, ttl)
	byName := func(n string) *candidate {
		for _, c := range cands {
			if c.name == n {
				return c
			}
		}
		return nil
	}
	// await reads candidate lines until one satisfies ok, echoing the
	// interesting ones; seen keeps them all.
	var seen []line
	await := func(what string, ok func(line) bool) (line, error) {
		for {
			select {
			case l := <-lines:
				seen = append(seen, l)
				switch l.kind {
				case "LEADING":
					say("  %-7s leads with epoch %d", l.who, l.epoch)
				case "WRITE-OK":
					say("  %-7s write with epoch %d accepted by the store", l.who, l.epoch)
				case "WRITE-REJECTED":
					say("  %-7s write with epoch %d REJECTED by the store: %s", l.who, l.epoch, l.detail)
				case "STOPPED":
					say("  %-7s stopped leading (epoch %d): %s", l.who, l.epoch, l.detail)
				case "ERROR":
					say("  %-7s error: %s", l.who, l.detail)
				}
				if ok(l) {
					return l, nil
				}
			case <-ctx.Done():
				return line{}, fmt.Errorf("timed out waiting for %s", what)
			}
		}
	}

	first, err := await("a leader", func(l line) bool { return l.kind == "LEADING" })
	if err != nil {
		return err
	}
	if _, err := await("the first write", func(l line) bool { return l.kind == "WRITE-OK" && l.who == first.who }); err != nil {
		return err
	}

	say("kill -9 %s (the leader, epoch %d): it cannot release; the lease lapses within its TTL", first.who, first.epoch)
	killed := time.Now()
	if err := byName(first.who).cmd.Process.Kill(); err != nil {
		return err
	}
	second, err := await("a takeover", func(l line) bool { return l.kind == "LEADING" && l.epoch > first.epoch })
	if err != nil {
		return err
	}
	say("takeover: %s leads with epoch %d > %d, %v after the kill (TTL %v)", second.who, second.epoch, first.epoch,
		time.Since(killed).Round(time.Millisecond), ttl)

	if _, err := await("the new leader to start a write", func(l line) bool { return l.kind == "WORKING" && l.who == second.who }); err != nil {
		return err
	}
	say("kill -STOP %s in the middle of a write (epoch %d), past its TTL", second.who, second.epoch)
	frozen := byName(second.who)
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	third, err := await("a takeover of the frozen leader", func(l line) bool { return l.kind == "LEADING" && l.epoch > second.epoch })
	if err != nil {
		return err
	}
	if _, err := await("the third leader's write", func(l line) bool { return l.kind == "WRITE-OK" && l.who == third.who }); err != nil {
		return err
	}
	say("kill -CONT %s: it resumes its write with its old epoch %d", second.who, second.epoch)
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	stale, err := await("the stale write's verdict", func(l line) bool {
		return (l.kind == "WRITE-REJECTED" || l.kind == "WRITE-OK") && l.who == second.who && l.epoch == second.epoch
	})
	if err != nil {
		return err
	}
	if stale.kind != "WRITE-REJECTED" {
		return errors.New("the stale write was accepted: fencing failed")
	}
	stoppedSecond := func(l line) bool { return l.kind == "STOPPED" && l.who == second.who }
	already := false
	for _, l := range seen {
		already = already || stoppedSecond(l)
	}
	if !already {
		if _, err := await("the old leader to stop", stoppedSecond); err != nil {
			return err
		}
	}

	var st lease.State
	if st, err = lease.New(pool).Inspect(ctx, key); err != nil {
		return err
	}
	say("summary: epochs %d < %d < %d; %s holds %q with epoch %d; the stale write of epoch %d was rejected",
		first.epoch, second.epoch, third.epoch, st.Owner, key, st.Epoch, second.epoch)
	say("stopping the candidates (SIGTERM: the leader releases its lease)")
	return nil
}

func startCandidate(self, name, dsn, storeDSN string, lines chan<- line) (*candidate, error) {
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), testprog.EnvVar+"=1", "PGLEASE_TC_ID="+name, "PGLEASE_TC_KEY="+key,
		"PGLEASE_TC_DSN="+dsn, "PGLEASE_TC_STORE_DSN="+storeDSN, "PGLEASE_TC_TTL="+ttl.String(),
		"PGLEASE_TC_WAITER=1", "PGLEASE_TC_WRITE=300ms")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &candidate{name: name, cmd: cmd, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e testprog.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue
			}
			l := line{who: name, epoch: e.Epoch}
			switch e.Ev {
			case "started":
				l.kind = "LEADING"
			case "working":
				l.kind = "WORKING"
			case "write":
				switch {
				case e.Stale:
					l.kind, l.detail = "WRITE-REJECTED", e.Err
				case e.Err != "":
					l.kind, l.detail = "WRITE-FAILED", e.Err
				default:
					l.kind = "WRITE-OK"
				}
			case "cancelled":
				l.kind, l.detail = "STOPPED", e.Cause
			case "error":
				l.kind, l.detail = "ERROR", e.Err
			default:
				continue
			}
			select {
			case lines <- l:
			default: // nobody listens any more
			}
		}
	}()
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

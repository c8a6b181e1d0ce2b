package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
)

const lockHelp = `Take KEY (waiting for it, up to --timeout), run COMMAND while holding it, renew
the grant every --ttl/3, and release it when COMMAND exits. COMMAND sees
PGLEASE_KEY, PGLEASE_OWNER and PGLEASE_EPOCH (the fencing epoch of the grant) in
its environment, and runs in a process group of its own.

When the lease is lost (a renewal is refused: it lapsed, or an operator ran
release --force) pglease sends SIGTERM to COMMAND's process group and SIGKILL
--grace later, and exits 7. When renewals fail for another reason (server
unreachable) pglease keeps trying until the grant's certain validity (measured
on the local monotonic clock from each renewal's send time) is --grace from its
end, then sends SIGTERM, and SIGKILL at that end: COMMAND is stopped before
another owner can take the key. SIGINT, SIGTERM or SIGHUP to pglease are passed
on as SIGTERM (SIGKILL --grace later); the key is then released.

Exit status: COMMAND's own (128+N when killed by signal N); 7 when the lease
was lost; 8 when the key stayed held for the whole --timeout; 126/127 when
COMMAND could not be run or found; the codes of every command (1-6) for
failures before COMMAND started.`

// codedError ends the invocation with its own exit status.
type codedError struct {
	code      int
	msg, hint string
}

func (e *codedError) Error() string { return e.msg }

type lockOpts struct {
	key, owner          string
	argv                []string
	ttl, grace, timeout time.Duration
}

func (a *app) lockCmd() *cobra.Command {
	var o lockOpts
	cmd := &cobra.Command{
		Use:   "lock KEY [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a key (etcdctl lock)",
		Long:  lockHelp,
		Example: `  pglease lock nightly-report -- ./report.sh --full
  pglease lock db-migrate --ttl 30s --timeout 10m -- sh -c 'migrate up --epoch "$PGLEASE_EPOCH"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0 || dash == 0:
				return usagef("lock: want KEY -- COMMAND [ARG...]")
			case dash > 1:
				return usagef("lock: want one KEY before --, got %d", dash)
			case len(args) < 2:
				return usagef("lock: want a COMMAND after KEY (pglease lock KEY -- COMMAND [ARG...])")
			}
			return nil
		},
		RunE: a.runE("lock", func(cmd *cobra.Command, args []string) error {
			o.key, o.argv = args[0], args[1:]
			if err := checkKey(o.key); err != nil {
				return err
			}
			if o.owner == "" {
				host, _ := os.Hostname()
				o.owner = fmt.Sprintf("%s/pglease-lock/%d", host, os.Getpid())
			}
			switch {
			case o.owner == "" || len(o.owner) > 1024:
				return fmt.Errorf("%w: --owner: 1 to 1024 bytes", lease.ErrInvalidInput)
			case o.ttl < time.Second:
				return usagef("--ttl %v: must be at least 1s", o.ttl)
			case o.grace < 0 || o.grace >= o.ttl*2/3:
				return usagef("--grace %v: must be at least 0 and below 2/3 of --ttl (%v): renewals run every --ttl/3", o.grace, o.ttl*2/3)
			case o.timeout < 0:
				return usagef("--timeout %v: must not be negative", o.timeout)
			}
			return a.lock(cmd.Context(), o)
		}),
	}
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 15*time.Second, "grant duration; renewed every ttl/3")
	f.DurationVar(&o.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the command must stop")
	f.DurationVar(&o.timeout, "timeout", 0, "give up (exit 8) when the key stays held this long (0: wait as long as it takes)")
	f.StringVar(&o.owner, "owner", "", "owner identity (default HOSTNAME/pglease-lock/PID)")
	return cmd
}

func (a *app) lock(ctx context.Context, o lockOpts) error {
	sess := &session{a: a}
	defer sess.drop()
	conn, err := sess.get(ctx)
	if err != nil {
		return err
	}
	g, ok, err := lease.New(conn).Acquire(ctx, o.key, o.owner, o.ttl)
	if err != nil {
		return err
	}
	if !ok {
		a.logf("lock: %s is held by another owner; waiting", quoteField(o.key))
		if g, err = a.waitFor(ctx, sess, o); err != nil {
			return err
		}
	}
	tok := g.Token
	a.logf("lock: holding %s as %s under epoch %d", quoteField(o.key), quoteField(o.owner), tok.Epoch)

	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn, err := sess.get(rctx)
		if err == nil {
			err = lease.New(conn).Release(rctx, tok)
		}
		switch {
		case err == nil:
			a.logf("lock: released %s (epoch %d)", quoteField(o.key), tok.Epoch)
		case errors.Is(err, lease.ErrLost):
			a.logf("lock: %s was no longer held at release: %v", quoteField(o.key), err)
		default:
			a.warnf("lock: releasing %s: %v (it lapses at its expiry)", quoteField(o.key), err)
		}
	}

	child := exec.Command(o.argv[0], o.argv[1:]...)
	child.Env = append(os.Environ(),
		"PGLEASE_KEY="+o.key, "PGLEASE_OWNER="+o.owner, "PGLEASE_EPOCH="+strconv.FormatInt(tok.Epoch, 10))
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, a.stdout, a.stderr
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	child.WaitDelay = time.Second
	if err := child.Start(); err != nil {
		release()
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNoCommand
		}
		return &codedError{code: code, msg: fmt.Sprintf("lock: %v", err)}
	}
	pid := child.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }()

	signalGroup := func(sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
	validUntil := g.ValidUntil()
	renewEvery, retryEvery := o.ttl/3, min(o.ttl/10, time.Second)
	renewT := time.NewTimer(renewEvery)
	defer renewT.Stop()
	termT := time.NewTimer(time.Until(validUntil.Add(-o.grace)))
	defer termT.Stop()
	killT := time.NewTimer(time.Hour)
	killT.Stop()
	defer killT.Stop()

	var (
		stopping    bool
		lostReason  string // set when the lease was lost
		interrupted = ctx.Done()
	)
	stop := func(killIn time.Duration) {
		if stopping {
			return
		}
		stopping = true
		renewT.Stop()
		termT.Stop()
		signalGroup(syscall.SIGTERM)
		killT.Reset(killIn)
	}
	for {
		select {
		case err := <-waited:
			signalGroup(syscall.SIGKILL) // what the command left behind in its group
			if lostReason != "" {
				if strings.HasPrefix(lostReason, "could not renew") {
					release() // it may still be ours: free it for the next owner
				}
				return &codedError{code: exitLost, msg: fmt.Sprintf("lock %s: lease lost (%s); the command was stopped", quoteField(o.key), lostReason)}
			}
			release()
			a.exitCode = exitStatus(child.ProcessState, err)
			return nil
		case <-interrupted:
			interrupted = nil
			a.logf("lock: interrupted: stopping the command (SIGTERM, SIGKILL in %v)", o.grace)
			stop(o.grace)
		case <-renewT.C:
			rctx, cancel := context.WithDeadline(ctx, minTime(time.Now().Add(renewEvery), validUntil.Add(-o.grace)))
			ng, err := renewOnce(rctx, sess, tok, o.ttl)
			cancel()
			switch {
			case err == nil:
				validUntil = ng.ValidUntil()
				renewT.Reset(renewEvery)
				termT.Reset(time.Until(validUntil.Add(-o.grace)))
			case errors.Is(err, lease.ErrLost):
				lostReason = err.Error()
				a.warnf("lock: %s: lease lost (%v): stopping the command (SIGTERM, SIGKILL in %v)", quoteField(o.key), err, o.grace)
				stop(o.grace)
			default:
				if ctx.Err() == nil {
					a.warnf("lock: renewing %s: %s; retrying", quoteField(o.key), connLostReason(err))
				}
				renewT.Reset(retryEvery)
			}
		case <-termT.C:
			lostReason = "could not renew before the grant's certain validity ran out"
			a.warnf("lock: %s: %s: stopping the command (SIGTERM, SIGKILL in %v)", quoteField(o.key), lostReason, time.Until(validUntil).Round(time.Millisecond))
			stop(max(time.Until(validUntil), 0))
		case <-killT.C:
			a.logf("lock: the command did not stop within the grace: SIGKILL")
			signalGroup(syscall.SIGKILL)
		}
	}
}

// waitFor waits for the key, up to o.timeout: it tries again when a
// notification about the key arrives (a release), when the holder's grant
// expires (on the server's clock, carried over to the local one from the
// read), and every second in case a notification was missed. (With core's
// lease.(*Waiter).Await this loop becomes one call.)
func (a *app) waitFor(ctx context.Context, sess *session, o lockOpts) (lease.Grant, error) {
	w, err := lease.NewWaiter(ctx, a.cfg, lease.WaiterOptions{})
	if err != nil {
		return lease.Grant{}, err
	}
	defer w.Close()
	wctx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	events := w.Watch(wctx, o.key) // subscribe before trying: no release is missed
	for {
		conn, err := sess.get(wctx)
		var g lease.Grant
		ok := false
		wake := time.Second
		if err == nil {
			c := lease.New(conn)
			g, ok, err = c.Acquire(wctx, o.key, o.owner, o.ttl)
			if err == nil && ok {
				return g, nil
			}
			if err == nil {
				var s lease.State
				readAt := time.Now()
				if s, err = c.Inspect(wctx, o.key); err == nil && s.Held {
					wake = min(wake, max(s.ExpiresAt.Sub(s.ServerNow)-time.Since(readAt)+time.Millisecond, 0))
				}
			}
		}
		switch {
		case ctx.Err() != nil:
			return lease.Grant{}, &codedError{code: exitError, msg: fmt.Sprintf("lock %s: interrupted while waiting for the key", quoteField(o.key))}
		case wctx.Err() != nil:
			return lease.Grant{}, &codedError{code: exitHeld, msg: fmt.Sprintf("lock %s: held by another owner for the whole --timeout %v", quoteField(o.key), o.timeout)}
		case err != nil && !connLost(sess.conn, err):
			return lease.Grant{}, err
		case err != nil:
			a.logf("lock: waiting: %s", connLostReason(err))
			sess.drop()
		}
		t := time.NewTimer(wake)
		select {
		case <-wctx.Done():
		case _, ok := <-events:
			if !ok {
				events = nil
			}
		case <-t.C:
		}
		t.Stop()
	}
}

func renewOnce(ctx context.Context, sess *session, tok lease.Token, ttl time.Duration) (lease.Grant, error) {
	conn, err := sess.get(ctx)
	if err != nil {
		return lease.Grant{}, err
	}
	g, err := lease.New(conn).Renew(ctx, tok, ttl)
	if err != nil && connLost(conn, err) {
		sess.drop()
	}
	return g, err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// exitStatus is the shell's view of how the command ended.
func exitStatus(ps *os.ProcessState, err error) int {
	if ps == nil {
		return exitError
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

const lockHelp = `Take KEY (waiting for it, up to --timeout), run COMMAND while holding it, renew
the grant every --ttl/3, and release it when COMMAND exits. COMMAND sees
PGLEASE_KEY, PGLEASE_OWNER and PGLEASE_EPOCH (the fencing epoch of the grant) in
its environment, and runs in a process group of its own.

When the lease is lost (a renewal is refused: it lapsed, or an operator ran
release --force) pglease sends SIGTERM to COMMAND's process group and SIGKILL
--grace later, and exits 7. When renewals fail for another reason (server
unreachable) pglease keeps trying. The grant's certain validity is measured on
the local monotonic clock from each renewal's send time, less a drift margin.
--grace before that end pglease sends SIGTERM, and SIGKILL at the end. So
COMMAND is stopped before another owner can take the key. SIGINT, SIGTERM or
SIGHUP to pglease are passed on as SIGTERM (SIGKILL --grace later); the key is
then released.

Exit status: COMMAND's own (128+N when killed by signal N); 7 when the lease
was lost; 8 when the key stayed held for the whole --timeout; 10 when the grace
after a promotion outlasted --timeout; 126/127 when COMMAND could not be run or
found; the codes of every command (1-6, 9) for failures before COMMAND started.`

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
				o.owner = lease.DefaultOwner()
			}
			if err := lease.CheckOwner(o.owner); err != nil {
				return fmt.Errorf("--owner: %w", err)
			}
			if o.ttl < time.Second {
				return usagef("--ttl %v: must be at least 1s", o.ttl)
			}
			// SIGTERM comes --grace before the term's deadline. The first
			// renewal, at --ttl/3 (lease.RenewInterval), must come before it.
			margin, err := lease.CheckMargin(o.ttl, 0)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("grace") {
				o.grace = min(o.grace, lease.RenewInterval(o.ttl)) // a short --ttl alone is not an error
			}
			if limit := o.ttl - lease.RenewInterval(o.ttl) - margin; o.grace < 0 || o.grace >= limit {
				return usagef("--grace %v: must be at least 0 and below %v (2/3 of --ttl less the drift margin): renewals run every --ttl/3", o.grace, limit)
			}
			if o.timeout < 0 {
				return usagef("--timeout %v: must not be negative", o.timeout)
			}
			return a.lock(cmd.Context(), o)
		}),
	}
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 15*time.Second, "grant duration; renewed every ttl/3")
	f.DurationVar(&o.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the command must stop (at most ttl/3 unless set)")
	f.DurationVar(&o.timeout, "timeout", 0, "give up (exit 8) when the key stays held this long (0: wait as long as it takes)")
	f.StringVar(&o.owner, "owner", "", "owner identity (default HOSTNAME-PID-RANDOM)")
	return cmd
}

func (a *app) lock(ctx context.Context, o lockOpts) error {
	sess := &session{a: a}
	defer sess.close()
	c := lease.New(sess)
	g, ok, err := c.Acquire(ctx, o.key, o.owner, o.ttl)
	if err != nil && !errors.Is(err, lease.ErrGrace) {
		return err
	}
	if !ok {
		if err != nil {
			a.logf("lock: %s: %v; waiting", quoteField(o.key), err)
		} else {
			a.logf("lock: %s is held by another owner; waiting", quoteField(o.key))
		}
		if g, err = a.waitFor(ctx, sess, c, o); err != nil {
			return err
		}
	}
	tok := g.Token
	a.logf("lock: holding %s as %s under epoch %d", quoteField(o.key), quoteField(o.owner), tok.Epoch)
	// The term ends a drift margin before the grant's certain validity
	// runs out. The command must be gone by then.
	term, err := c.Begin(g, 0, nil)
	if err != nil {
		return err
	}

	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		switch err := term.Release(rctx); {
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

	// The command gets SIGTERM --grace before the term's deadline and
	// SIGKILL when the term ends. Every timer runs on the client's clock.
	clk := c.Clock()
	signalGroup := func(sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
	termAt := func() time.Duration { return term.Deadline().Add(-o.grace).Sub(clk.Now()) }
	termT := clk.NewTimer(termAt())
	defer termT.Stop()
	killT := clk.NewTimer(time.Hour)
	killT.Stop()
	defer killT.Stop()

	// The keep-alive renews every --ttl/3 and retries every
	// min(--ttl/10, 1s); it reports each renewal to this loop.
	kctx, stopRenewing := context.WithCancel(ctx)
	defer stopRenewing()
	renewed := make(chan error)
	go func() {
		_ = term.KeepAlive(kctx, lease.KeepAliveOptions{
			RetryInterval: min(o.ttl/10, time.Second),
			Observe: func(_ *lease.Term, _ time.Duration, err error) {
				select {
				case renewed <- err:
				case <-kctx.Done():
				}
			},
		})
	}()

	var (
		stopping    bool
		lostReason  string // set when the lease was lost
		interrupted = ctx.Done()
		termDone    = term.Done()
	)
	stop := func(killIn time.Duration) {
		if stopping {
			return
		}
		stopping = true
		stopRenewing()
		termT.Stop()
		signalGroup(syscall.SIGTERM)
		killT.Reset(killIn)
	}
	for {
		select {
		case err := <-waited:
			signalGroup(syscall.SIGKILL) // what the command left behind in its group
			stopRenewing()
			if lostReason != "" {
				if !errors.Is(term.Err(), lease.ErrLost) {
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
		case err := <-renewed:
			switch {
			case err == nil:
				if !stopping {
					termT.Reset(termAt())
				}
			case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrLocalDeadline):
				// The term has ended: termDone follows.
			case ctx.Err() == nil:
				a.warnf("lock: renewing %s: %s; retrying", quoteField(o.key), connLostReason(err))
			}
		case <-termT.C():
			lostReason = "could not renew before the grant's certain validity ran out"
			left := max(term.Deadline().Sub(clk.Now()), 0)
			a.warnf("lock: %s: %s: stopping the command (SIGTERM, SIGKILL in %v)", quoteField(o.key), lostReason, left.Round(time.Millisecond))
			stop(left)
		case <-termDone:
			termDone = nil
			switch err := term.Err(); {
			case errors.Is(err, lease.ErrLost):
				if lostReason == "" {
					lostReason = err.Error()
				}
				a.warnf("lock: %s: lease lost (%v): stopping the command (SIGTERM, SIGKILL in %v)", quoteField(o.key), err, o.grace)
				stop(o.grace)
			case errors.Is(err, lease.ErrLocalDeadline):
				if lostReason == "" {
					lostReason = "could not renew before the grant's certain validity ran out"
				}
				stop(0)
				signalGroup(syscall.SIGKILL)
			}
		case <-killT.C():
			a.logf("lock: the command did not stop within the grace: SIGKILL")
			signalGroup(syscall.SIGKILL)
		}
	}
}

// waitFor waits for the key, up to o.timeout, and acquires it. It tries
// again whenever lease's wake policy (listen.Await) sees the key free.
func (a *app) waitFor(ctx context.Context, sess *session, c *lease.Client, o lockOpts) (lease.Grant, error) {
	wctx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	w, err := listen.NewWaiter(wctx, a.cfg, listen.Options{})
	if err != nil && wctx.Err() == nil {
		return lease.Grant{}, err
	}
	if w != nil {
		defer w.Close()
	}
	var grace *lease.GraceError // the last denial, when it was the grace's
	for {
		_, err := listen.Await(wctx, w, c, o.key, time.Second, func(s lease.State) bool { return !s.Held })
		if err == nil {
			var g lease.Grant
			var ok bool
			if g, ok, err = c.Acquire(wctx, o.key, o.owner, o.ttl); err == nil && ok {
				return g, nil
			}
			grace = nil
			// A promotion's grace: sleep until it ends (nothing wakes a
			// Waiter then), and ask again.
			if errors.As(err, &grace) && listen.WaitOutGrace(wctx, c, err) {
				err = nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return lease.Grant{}, &codedError{code: exitError, msg: fmt.Sprintf("lock %s: interrupted while waiting for the key", quoteField(o.key))}
		case wctx.Err() != nil && grace != nil:
			return lease.Grant{}, &codedError{code: exitGrace, msg: fmt.Sprintf("lock %s: no grant during the grace after a promotion, which ends at %s, after the --timeout %v",
				quoteField(o.key), grace.Until.UTC().Format(time.RFC3339Nano), o.timeout),
				hint: "`pglease status` shows the grace in force and when it ends"}
		case wctx.Err() != nil:
			return lease.Grant{}, &codedError{code: exitHeld, msg: fmt.Sprintf("lock %s: held by another owner for the whole --timeout %v", quoteField(o.key), o.timeout)}
		case err != nil && !sess.lost(err):
			return lease.Grant{}, err
		case err != nil:
			a.logf("lock: waiting: %s", connLostReason(err))
			t := c.Clock().NewTimer(time.Second)
			select {
			case <-wctx.Done():
			case <-t.C():
			}
			t.Stop()
		}
	}
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

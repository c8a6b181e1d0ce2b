// Command clientgo elects a leader with client-go's own
// leaderelection.RunOrDie, through a pg_lease lock in PostgreSQL: no
// Kubernetes API server is involved.
//
//	export PGLEASE_DSN=...   # or -dsn-file /path/to/a/file/holding/it
//	go run ./examples/clientgo -id a &
//	go run ./examples/clientgo -id b &
//
// The DSN comes from $PGLEASE_DSN or the file named by -dsn-file, so that it
// (and its password) never shows in usage text, flag defaults or process
// listings. (-dsn still takes one on the command line, for tests; it has no
// default.)
//
// Each process is one candidate. The leader prints its fencing token
// (key/owner@epoch); on SIGINT or SIGTERM it releases the lease
// (ReleaseOnCancel), so a follower takes over at its next retry instead of
// waiting for the TTL. Kill the leader with SIGKILL and a follower takes over
// once the grant lapses, with a greater epoch.
//
// Output lines (one event each, timestamped with the wall clock):
//
//	<time> epoch-start <key>/<id>@<epoch>   a term began (OnEpochChange)
//	<time> leading <key>/<id>@<epoch>       client-go called OnStartedLeading
//	<time> acting <key>/<id>@<epoch>        work under that token starts
//	<time> epoch-end <key>/<id>@<epoch>     the term ended: stop using the token
//	<time> stopped-leading                  client-go called OnStoppedLeading
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/client-go/tools/leaderelection"
)

func main() {
	var (
		dsnFile       = flag.String("dsn-file", "", "file holding the PostgreSQL connection string (default: $PGLEASE_DSN)")
		dsn           = flag.String("dsn", "", "PostgreSQL connection string; visible in process listings, prefer $PGLEASE_DSN or -dsn-file")
		key           = flag.String("key", "example-clientgo", "lease key")
		id            = flag.String("id", "", "this candidate's unique identity (default: lease.DefaultOwner, host-pid-random)")
		leaseDuration = flag.Duration("lease-duration", 15*time.Second, "lease TTL, and client-go's LeaseDuration")
		renewDeadline = flag.Duration("renew-deadline", 0, "client-go's RenewDeadline (0: 2/3 of the lease duration)")
		retryPeriod   = flag.Duration("retry-period", 0, "client-go's RetryPeriod (0: 2/15 of the lease duration)")
		leadFor       = flag.Duration("lead-for", 0, "step down (release) after leading this long; 0: lead until signalled")
	)
	flag.Parse()
	if *id == "" {
		*id = lease.DefaultOwner()
	}
	if *dsn == "" {
		var err error
		if *dsn, err = readDSN(*dsnFile, "PGLEASE_DSN"); err != nil {
			fmt.Fprintln(os.Stderr, "clientgo:", err)
			os.Exit(2)
		}
	}
	if err := run(*dsn, *key, *id, *leaseDuration, *renewDeadline, *retryPeriod, *leadFor); err != nil {
		fmt.Fprintln(os.Stderr, "clientgo:", err)
		os.Exit(1)
	}
}

// readDSN returns the connection string held in file (surrounding white
// space trimmed) or, when file is empty, in $env. Its errors name the file or
// the variable, never any part of the DSN.
func readDSN(file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err // names the path only
		}
		if dsn := strings.TrimSpace(string(b)); dsn != "" {
			return dsn, nil
		}
		return "", fmt.Errorf("the DSN file %s is empty", file)
	}
	if dsn := strings.TrimSpace(os.Getenv(env)); dsn != "" {
		return dsn, nil
	}
	return "", fmt.Errorf("no PostgreSQL DSN: $%s is empty or unset (or pass -dsn-file)", env)
}

var outMu sync.Mutex

func say(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Printf("%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func run(dsn, key, id string, leaseDuration, renewDeadline, retryPeriod, leadFor time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

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
	// No cancel request when the process stops (see finishOnStop).
	pcfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return finishOnStop{c.Conn()} }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	// One listener per process: a follower's Get waits for the release (or
	// the server-side lapse) instead of polling every RetryPeriod.
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		return err
	}
	defer w.Close()

	lock, err := resourcelock.New(lease.New(pool), resourcelock.Config{
		Key: key, Identity: id,
		LeaseDuration: leaseDuration,
		Waiter:        w,
		OnEpochChange: func(old, new lease.Token) {
			if old.Epoch != 0 {
				say("epoch-end %s", old)
			}
			if new.Epoch != 0 {
				say("epoch-start %s", new)
			}
		},
	})
	if err != nil {
		return err
	}

	// The lock checks client-go's timings against its lease duration (and
	// fills those left 0), naming every offending field, instead of letting
	// client-go panic or its leader context outlive the grant.
	cfg, err := lock.LeaderElectionConfig(leaderelection.LeaderElectionConfig{
		Name:            key,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leaderCtx context.Context) {
				tok, _ := lock.Token()
				say("leading %s", tok)
				if leadFor > 0 {
					time.AfterFunc(leadFor, cancel)
				}
				work(leaderCtx, lock, retryPeriod)
			},
			OnStoppedLeading: func() { say("stopped-leading") },
		},
	})
	if err != nil {
		return err
	}
	retryPeriod = cfg.RetryPeriod
	leaderelection.RunOrDie(ctx, cfg)
	return nil
}

// work acts under the current epoch until it ends, then under the next one
// (the lock may re-acquire under a new epoch while client-go keeps leading),
// until leadership ends.
func work(leaderCtx context.Context, lock *resourcelock.Lock, retry time.Duration) {
	for leaderCtx.Err() == nil {
		ctx, cancel, err := lock.TokenContext(leaderCtx)
		if err != nil { // between epochs: wait for the elector to re-acquire
			select {
			case <-leaderCtx.Done():
			case <-time.After(retry / 4):
			}
			continue
		}
		tok, _ := lease.TokenFromContext(ctx)
		say("acting %s", tok)
		// Real work would pass ctx (and tok, to fenced writes) along here.
		<-ctx.Done()
		cancel()
	}
}

// finishOnStop is each connection's context handler: pgx interrupts a query
// whose context ended by a socket deadline, and sends a cancel request as
// it does, which PgBouncer 1.18 can exit on (docs/operations.md). A query
// cancelled because the process stops gets 5 s to finish; no lease call
// waits on the server, so none is interrupted. A query past its deadline is
// interrupted at once, as pgx does by default: client-go's renewal still
// ends at RenewDeadline, and leadership never outlives the grant.
type finishOnStop struct{ conn net.Conn }

func (h finishOnStop) HandleCancel(ctx context.Context) {
	var delay time.Duration
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		delay = 5 * time.Second
	}
	_ = h.conn.SetDeadline(time.Now().Add(delay))
}

func (h finishOnStop) HandleUnwatchAfterCancel() { _ = h.conn.SetDeadline(time.Time{}) }

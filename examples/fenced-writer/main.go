// Command fenced-writer shows a stale writer rejected by fencing.
//
// Writer A holds the lease "report" and writes to a store; A then pauses
// (a GC pause, SIGSTOP, a network partition) past its TTL; B takes the
// lease over with a higher epoch and writes; A resumes and writes once more
// with its old epoch, believing it still leads. The store's guard rejects
// that write, and so does a same-database fenced transaction.
//
// In a service, the token comes from the elector's leader context
// (lease.TokenFromContext, see pkg/elector); here two lease clients play
// the writers so that the interleaving is exact.
//
//	go run ./examples/fenced-writer -dsn "$DSN"          # creates pg_lease there if absent
//	PGLEASE_DSN="$DSN" go run ./examples/fenced-writer
//	go run ./examples/fenced-writer -dsn "$DSN" -store-dsn "$OTHER"
//
// It depends on nothing internal to this module: copy it out as it is. Its
// test starts a throwaway server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func main() {
	// No flag default holds a connection string: usage text prints
	// defaults, and a DSN may carry a password.
	dsn := flag.String("dsn", "", "database for the lease (pg_lease is created there if absent; default $PGLEASE_DSN)")
	storeDSN := flag.String("store-dsn", "", "database playing the external store (default: the lease database)")
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("PGLEASE_DSN")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := mainErr(ctx, *dsn, *storeDSN); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-writer:", err)
		os.Exit(1)
	}
}

func mainErr(ctx context.Context, dsn, storeDSN string) error {
	if dsn == "" {
		return errors.New("no database: pass -dsn or set PGLEASE_DSN to a PostgreSQL database the role may " +
			"CREATE EXTENSION pg_lease in (the server needs the extension's files: make -C sql install)")
	}
	if storeDSN == "" {
		storeDSN = dsn
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := leaseadmin.InstallExtension(ctx, pool); err != nil {
		return err
	}
	return run(ctx, os.Stdout, dsn, storeDSN, "report")
}

// run plays the story on key, printing what happens to w.
func run(ctx context.Context, w io.Writer, dsn, storeDSN, key string) error {
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
	leases, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer leases.Close()
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

	// The external store: a table, guarded by the highest epoch it has
	// accepted per resource (fence_epochs).
	guard, err := fence.NewPGGuard(store, fence.PGGuardOptions{})
	if err != nil {
		return err
	}
	if err := guard.EnsureTable(ctx); err != nil {
		return err
	}
	if _, err := store.Exec(ctx, "CREATE TABLE IF NOT EXISTS reports (name text PRIMARY KEY, written_by text)"); err != nil {
		return err
	}
	save := func(t lease.Token) error {
		return guard.Write(ctx, t, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO reports VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET written_by = EXCLUDED.written_by`, t.Key, fmt.Sprintf("%s@%d", t.Owner, t.Epoch))
			return err
		})
	}
	verdict := func(err error) string {
		switch {
		case err == nil:
			return "accepted"
		case errors.Is(err, fence.ErrStale):
			return "rejected: " + err.Error()
		default:
			return "failed: " + err.Error()
		}
	}

	client := lease.New(leases)
	const ttl = time.Second
	a, ok, err := client.Acquire(ctx, key, "A", ttl)
	if err != nil || !ok {
		return fmt.Errorf("A could not acquire %s (ok=%v): %v", key, ok, err)
	}
	fmt.Fprintf(w, "A acquired %s with epoch %d\n", key, a.Epoch)
	fmt.Fprintf(w, "A writes with epoch %d: %s\n", a.Epoch, verdict(save(a.Token)))

	fmt.Fprintln(w, "A pauses past its TTL (GC pause, SIGSTOP, partition): no renewal")
	// Wait until the server's expiry has certainly passed. a.ValidUntil() is
	// the wrong bound here: it is the earliest instant the grant may end (the
	// request's send time plus the TTL), right for a holder that stops acting
	// in time, too early for a waiter, since the server read its clock later.
	// A read's ExpiresLocal is the latest bound: its reply's receipt plus the
	// time the server said was left.
	st, err := client.Inspect(ctx, key)
	if err != nil {
		return err
	}
	time.Sleep(time.Until(st.ExpiresLocal()))

	b, ok, err := client.Acquire(ctx, key, "B", time.Minute)
	if err != nil || !ok {
		return fmt.Errorf("B could not take %s over (ok=%v): %v", key, ok, err)
	}
	fmt.Fprintf(w, "B took %s over with epoch %d\n", key, b.Epoch)
	fmt.Fprintf(w, "B writes with epoch %d: %s\n", b.Epoch, verdict(save(b.Token)))

	fmt.Fprintf(w, "A resumes, still believing it leads, and writes with epoch %d: %s\n", a.Epoch, verdict(save(a.Token)))
	err = fence.InTx(ctx, leases, a.Token, func(pgx.Tx) error { return nil })
	fmt.Fprintf(w, "A's write in the lease database (fence.InTx): %s\n", verdict(err))

	var by string
	if err := store.QueryRow(ctx, "SELECT written_by FROM reports WHERE name = $1", key).Scan(&by); err != nil {
		return err
	}
	fmt.Fprintf(w, "the store holds %s written by %s\n", key, by)
	return client.Release(ctx, b.Token)
}

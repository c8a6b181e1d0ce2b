// Command pglease shows and fixes pg_lease leases without writing SQL, the
// way kubectl get lease or etcdctl elect do for theirs.
//
//	pglease install [--schema-only]     install pg_lease into the database
//	pglease version                     client, SQL and server versions
//	pglease get KEY [-o table|json|yaml] one key's holder, epoch, expiry
//	pglease list [-o table|json|yaml]   every key
//	pglease watch [KEY...]              grants, renewals, releases, lapses as they happen
//	pglease release --force KEY         free a key whatever its holder (operators)
//
// The connection comes from --dsn, else $PGLEASE_DSN, else the libpq
// environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, ...).
// Passwords are never printed. Exit codes: 0 success, 1 other error, 2 usage
// or invalid input, 3 pg_lease not installed, 4 permission denied, 5 key
// never leased (get).
package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

var errUsage = errors.New("usage")

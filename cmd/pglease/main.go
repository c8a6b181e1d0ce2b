// Command pglease shows and fixes pg_lease leases without writing SQL, the
// way kubectl get lease or etcdctl elect and lock do for theirs.
//
//	pglease install [--schema-only]        install or update pg_lease in the database
//	pglease version [--client]             pglease, SQL and server versions
//	pglease get KEY... [-o FORMAT]         keys' holder, status, epoch, remaining time, age
//	pglease list [-o FORMAT]               every key
//	pglease watch [KEY...] [-o FORMAT]     grants, renewals, releases, lapses as they happen
//	pglease lock KEY -- COMMAND [ARG...]   run COMMAND while holding KEY
//	pglease release --force KEY            free a key whatever its holder (operators)
//	pglease cleanup --free-for DURATION    delete keys free for at least DURATION (operators)
//	pglease history KEY [-o FORMAT]        a key's last grants, releases, takeovers and their reasons
//	pglease health [KEY...] [-o FORMAT]    every key's leader, term and time without a leader
//	pglease serve-metrics [--listen ADDR]  keys' leadership as Prometheus metrics (loopback by default)
//
// Every command takes --help; flags go anywhere on the line. The connection
// comes from --dsn-file, $PGLEASE_DSN_FILE, $PGLEASE_DSN, else the libpq
// environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, ...);
// --dsn exists but shows the password to every local user in the process
// list. Passwords are never printed. The exit codes are in exitCodesHelp
// (root.go) and in README.md beside this file.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

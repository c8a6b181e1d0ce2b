package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/leasemetrics"
)

// defaultMetricsListen is serve-metrics' address unless --listen: loopback,
// so that nothing is served beyond the host unless asked.
const defaultMetricsListen = "127.0.0.1:9188"

// minTokenBytes is the shortest bearer token serve-metrics accepts.
const minTokenBytes = 16

func (a *app) serveMetricsCmd() *cobra.Command {
	var (
		listen    string
		period    time.Duration
		timeout   time.Duration
		tokenFile string
		mc        leasemetrics.Config
	)
	cmd := &cobra.Command{
		Use:   "serve-metrics [--listen ADDRESS] [--period DURATION] [--max-keys N] [--key-prefix PREFIX]...",
		Short: "Serve every key's leadership as Prometheus metrics",
		Long: `Serve, at http://ADDRESS/metrics, the leadership of the database's keys as
Prometheus metrics (pkg/leasemetrics; pg_lease 0.4.0 or later): whether each key is
held, its epoch, term age, time without a holder, grants, and within --period the
new terms and the time without a holder; the promotion grace and the timeline. Each
scrape runs two read-only queries. /healthz answers 200 while the process runs. The
alert rules and the Grafana dashboard in config/prometheus use these metrics. Runs
until interrupted (SIGINT, SIGTERM).

What is served is bounded and reveals no more than asked, because any role may name
keys: it listens on loopback unless --listen names another address; it exports at
most --max-keys keys (the first in byte order among those --key-prefix selects;
pg_lease_keys_omitted counts the rest); a key longer than 128 bytes is exported as its
start, "…" and 16 hex digits of its SHA-256; owner strings (--show-owners), the
holders' database roles (--show-roles) and the database name (--show-database) are
left out unless asked for.

Authentication: with a token from --bearer-token-file, $PGLEASE_METRICS_TOKEN_FILE or
$PGLEASE_METRICS_TOKEN (at least 16 bytes; read at start; never printed), /metrics answers only
requests carrying "Authorization: Bearer TOKEN" (in Prometheus's scrape config:
authorization.credentials_file). For TLS, serve it behind a proxy.`,
		Example: `  pglease serve-metrics
  pglease serve-metrics --key-prefix billing/ --show-owners
  PGLEASE_METRICS_TOKEN_FILE=/run/secrets/metrics-token pglease serve-metrics --listen :9188`,
		Args: args(0, 0, "no arguments"),
		RunE: a.runE("serve-metrics", func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if period < time.Second || period > 366*24*time.Hour {
				return usagef("--period %v: want 1s to 366 days", period)
			}
			if timeout <= 0 {
				return usagef("--timeout %v: want a positive duration", timeout)
			}
			if mc.MaxKeys < 1 || mc.MaxKeys > leasemetrics.MaxMaxKeys {
				return usagef("--max-keys %d: want 1 to %d", mc.MaxKeys, leasemetrics.MaxMaxKeys)
			}
			token, source, err := a.metricsToken(tokenFile)
			if err != nil {
				return err
			}
			host, port, err := net.SplitHostPort(listen)
			if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || (n == 0 && port != "0") {
				return usagef("--listen %q: want host:port, the port a number from 0 to 65535", listen)
			}
			if len(mc.KeyPrefixes) > 100 {
				return usagef("--key-prefix: %d prefixes, want at most 100", len(mc.KeyPrefixes))
			}
			for _, p := range mc.KeyPrefixes {
				if p == "" || len(p) > 1024 || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
					return usagef("--key-prefix %q: want 1 to 1024 bytes of UTF-8 without NUL", leasemetrics.Label(p))
				}
			}
			mc.Period, mc.Timeout = period, timeout
			mc.OnError = func(err error) { a.warnf("scrape: %v", err) }
			cfg, err := a.config()
			if err != nil {
				return err
			}
			pc, err := pgxpool.ParseConfig("")
			if err != nil {
				return err
			}
			pc.ConnConfig = cfg.Copy()
			pc.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(ctx, pc) // connects on first use
			if err != nil {
				return &connectError{err: err}
			}
			defer pool.Close()
			coll, err := leasemetrics.New(pool, mc)
			if err != nil {
				return usagef("%v", err)
			}
			// The first read checks the connection and the installed version
			// before anything is served.
			if err := pool.Ping(ctx); err != nil {
				return &connectError{err: err}
			}
			if err := checkReadable(ctx, pool, coll, timeout); err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(coll)
			mux := http.NewServeMux()
			var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
			if token != "" {
				metrics = bearer(token, metrics)
			}
			mux.Handle("/metrics", metrics)
			mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			fmt.Fprintf(a.stdout, "serving the metrics of database %s at http://%s/metrics\n", a.database(), ln.Addr())
			switch {
			case token != "":
				a.logf("/metrics requires the bearer token from %s", source)
			case !loopback(host):
				a.warnf("serving /metrics on %s without authentication: anyone who reaches it reads the key names "+
					"(set a bearer token, or serve it behind an authenticating proxy)", ln.Addr())
			}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return err
			}
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultMetricsListen, "address to serve /metrics on (host:port; port 0 picks one; :9188 for every interface)")
	f.DurationVar(&period, "period", leasemetrics.DefaultPeriod, "window of the pg_lease_key_recent_* metrics")
	f.DurationVar(&timeout, "timeout", leasemetrics.DefaultTimeout, "bound of one scrape's queries")
	f.IntVar(&mc.MaxKeys, "max-keys", leasemetrics.DefaultMaxKeys, "most keys exported per scrape (pg_lease_keys_omitted counts the rest)")
	f.StringArrayVar(&mc.KeyPrefixes, "key-prefix", nil, "export only keys starting with this prefix (repeatable; default every key)")
	f.BoolVar(&mc.ShowOwners, "show-owners", false, "export each held key's owner string (pg_lease_key_holder_info, holder label)")
	f.BoolVar(&mc.ShowRoles, "show-roles", false, "export the database role of each held key's grant (pg_lease_key_holder_info, role label)")
	f.BoolVar(&mc.ShowDatabase, "show-database", false, "put the database's name in the database label (default empty)")
	f.StringVar(&tokenFile, "bearer-token-file", "", "file holding the bearer token /metrics requires (else $PGLEASE_METRICS_TOKEN_FILE, $PGLEASE_METRICS_TOKEN)")
	return cmd
}

// metricsToken reads serve-metrics' bearer token: --bearer-token-file, else
// $PGLEASE_METRICS_TOKEN_FILE, else $PGLEASE_METRICS_TOKEN; "" when none is
// set. source names where it came from, never the token.
func (a *app) metricsToken(file string) (token, source string, err error) {
	switch {
	case file != "":
		source = "--bearer-token-file " + file
	case a.getenv("PGLEASE_METRICS_TOKEN_FILE") != "":
		file = a.getenv("PGLEASE_METRICS_TOKEN_FILE")
		source = "$PGLEASE_METRICS_TOKEN_FILE (" + file + ")"
	case a.getenv("PGLEASE_METRICS_TOKEN") != "":
		token, source = a.getenv("PGLEASE_METRICS_TOKEN"), "$PGLEASE_METRICS_TOKEN"
	default:
		return "", "", nil
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", "", usagef("reading the bearer token from %s: %v", source, err)
		}
		token = strings.TrimSpace(string(b))
	}
	a.token = token
	if len(token) < minTokenBytes || strings.ContainsAny(token, " \t\r\n") {
		return "", "", usagef("the bearer token from %s: want at least %d bytes without white space", source, minTokenBytes)
	}
	return token, source, nil
}

// bearer serves next only to requests that carry token as a bearer token;
// the others get 401.
func bearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pglease"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopback reports whether host (of --listen) is a loopback address or
// name; an empty host is every interface.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkReadable runs the collector's reads once, so that a database without
// pg_lease 0.4.0, or a role that may not call its functions, fails at start
// with the usual message and exit status rather than at every scrape.
func checkReadable(ctx context.Context, pool *pgxpool.Pool, coll *leasemetrics.Collector, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return needsHistory(ctx, pool, "serve-metrics", coll.Check(ctx))
}

// needsHistory turns a history or health call's "not installed" into what
// it is when an older pg_lease is installed: a version without them.
func needsHistory(ctx context.Context, q lease.Querier, what string, err error) error {
	if !errors.Is(err, lease.ErrNotInstalled) {
		return err
	}
	v, _, ierr := leaseadmin.Installed(ctx, q)
	if ierr != nil || v == "" {
		return err
	}
	return &incompatibleError{
		msg:  fmt.Sprintf("%s needs pg_lease 0.4.0 or later (its leadership history); the database has %s", what, v),
		hint: fmt.Sprintf("update it with `pglease install` (this pglease ships %s)", leaseadmin.Version),
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/leasemetrics"
)

func (a *app) serveMetricsCmd() *cobra.Command {
	var (
		listen  string
		period  time.Duration
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve-metrics [--listen ADDRESS] [--period DURATION]",
		Short: "Serve every key's leadership as Prometheus metrics",
		Long: `Serve, at http://ADDRESS/metrics, the leadership of every key of the database as
Prometheus metrics (pkg/leasemetrics; pg_lease 0.4.0 or later): holder, epoch,
term age, time without a holder, grants, and within --period the new terms and the
time without a holder; the promotion grace and the timeline. Each scrape runs two
read-only queries. /healthz answers 200 while the process runs. The alert rules
and the Grafana dashboard in config/prometheus use these metrics. Runs until
interrupted (SIGINT, SIGTERM).`,
		Example: "  pglease serve-metrics --listen :9188",
		Args:    args(0, 0, "no arguments"),
		RunE: a.runE("serve-metrics", func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if period < time.Second || period > 366*24*time.Hour {
				return usagef("--period %v: want 1s to 366 days", period)
			}
			if timeout <= 0 {
				return usagef("--timeout %v: want a positive duration", timeout)
			}
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
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				return &connectError{err: err}
			}
			defer pool.Close()
			// The first read checks the connection and the installed version
			// before anything is served.
			if err := pool.Ping(ctx); err != nil {
				return &connectError{err: err}
			}
			coll, err := leasemetrics.New(pool, leasemetrics.Config{
				Period: period, Timeout: timeout,
				OnError: func(err error) { a.warnf("scrape: %v", err) },
			})
			if err != nil {
				return usagef("%v", err)
			}
			if err := checkReadable(ctx, pool, timeout); err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(coll)
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
			mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			fmt.Fprintf(a.stdout, "serving the metrics of database %s at http://%s/metrics\n", a.database(), ln.Addr())
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
	cmd.Flags().StringVar(&listen, "listen", ":9188", "address to serve /metrics on (host:port; port 0 picks one)")
	cmd.Flags().DurationVar(&period, "period", leasemetrics.DefaultPeriod, "window of the pg_lease_key_recent_* metrics")
	cmd.Flags().DurationVar(&timeout, "timeout", leasemetrics.DefaultTimeout, "bound of one scrape's queries")
	return cmd
}

// checkReadable runs the collector's reads once, so that a database without
// pg_lease 0.4.0, or a role that may not call its functions, fails at start
// with the usual message and exit status rather than at every scrape.
func checkReadable(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := leaseadmin.Health(ctx, lease.New(pool), time.Second)
	return needsHistory(ctx, pool, "serve-metrics", err)
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

// Package benchutil holds what the benchmark programs under bench/ share:
// throwaway servers with pg_lease (the shipped version), percentiles, JSON output and a small
// SVG plotter. Benchmarks print numbers; nothing here asserts a timing.
package benchutil

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

// ExtensionVersion is the pg_lease version the benchmarks install: the one
// this module ships (CREATE EXTENSION ... VERSION follows the update chain
// from the 0.1.0 base script).
const ExtensionVersion = pgleasesql.Version

// StartServer starts a throwaway server with settings (see pgtest.Options)
// and installs the extension files into its installation.
func StartServer(ctx context.Context, settings map[string]string) (*pgtest.Server, error) {
	s, err := pgtest.Start(ctx, pgtest.Options{Settings: settings})
	if err != nil {
		return nil, err
	}
	if err := s.InstallExtensionFiles(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// SetMode sets in settings what a run's mode changes on the server:
// durable (fsync on) or stmt (fsync off: the statements' own cost, without
// the flush); any other mode is an error.
func SetMode(settings map[string]string, mode string) error {
	switch mode {
	case "durable":
		settings["fsync"] = "on"
	case "stmt":
		settings["fsync"] = "off"
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}

// CreateDB creates database name with pg_lease at ExtensionVersion and runs
// the extra statements in it. It returns the database's TCP DSN.
func CreateDB(ctx context.Context, s *pgtest.Server, name string, extra ...string) (string, error) {
	dsn, err := s.CreateDatabase(ctx, name)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	stmts := append([]string{
		fmt.Sprintf("CREATE EXTENSION IF NOT EXISTS pg_lease VERSION '%s'", ExtensionVersion),
	}, extra...)
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("%s: %.80s: %w", name, q, err)
		}
	}
	return dsn, nil
}

// Stats are latency percentiles in microseconds (nearest rank).
type Stats struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P95  float64 `json:"p95_us"`
	P99  float64 `json:"p99_us"`
	Max  float64 `json:"max_us"`
}

// Summarize sorts xs (µs) in place and returns its percentiles.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	sort.Float64s(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Stats{N: len(xs), Mean: sum / float64(len(xs)),
		P50: Quantile(xs, 0.50), P95: Quantile(xs, 0.95), P99: Quantile(xs, 0.99), Max: xs[len(xs)-1]}
}

// Quantile is the nearest-rank q-quantile of sorted xs.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

// Micros converts a duration to float microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// WriteJSON writes v, indented, to dir/name.
func WriteJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644)
}

// WriteResults writes a run's results: v (indented JSON) to dir/name.json
// and md (their Markdown report) to dir/name.md; it prints md.
func WriteResults(dir, name string, v any, md string) error {
	if err := WriteJSON(dir, name+".json", v); err != nil {
		return err
	}
	fmt.Print(md)
	return os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644)
}

// ServerInfo is what every result file records about the server it ran on.
type ServerInfo struct {
	Version           string `json:"server_version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	WalSyncMethod     string `json:"wal_sync_method"`
	ExtensionVersion  string `json:"pg_lease_version"`
}

// ReadServerInfo reads ServerInfo through dsn (a database with pg_lease).
func ReadServerInfo(ctx context.Context, dsn string) (ServerInfo, error) {
	var si ServerInfo
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return si, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('shared_buffers'), current_setting('wal_sync_method'), lease.version()`).
		Scan(&si.Version, &si.Fsync, &si.SynchronousCommit, &si.SharedBuffers, &si.WalSyncMethod, &si.ExtensionVersion)
	return si, err
}

// LoadAvg returns the 1-minute load average (NaN if unreadable).
func LoadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

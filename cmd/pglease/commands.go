package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// args checks the number of positional arguments as a usage error.
func args(min, max int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usagef("%s: want %s, got %d argument(s)", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

func (a *app) installCmd() *cobra.Command {
	var schemaOnly bool
	cmd := &cobra.Command{
		Use:   "install [--schema-only]",
		Short: "Install pg_lease in the database, or update it to this pglease's version",
		Long: `Install pg_lease ` + leaseadmin.Version + ` in the database: CREATE EXTENSION pg_lease (the server needs the
extension's files), or with --schema-only the same SQL as a plain schema owned by
this role (managed PostgreSQL without custom extensions). An older install is
updated; an install at this version is left as it is. Needs CREATE on the database.`,
		Args: args(0, 0, "no arguments"),
		RunE: a.runE("install", func(cmd *cobra.Command, _ []string) error {
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				ctx := cmd.Context()
				var err error
				if schemaOnly {
					a.logf("installing pg_lease %s as a plain schema", leaseadmin.Version)
					err = leaseadmin.InstallSchema(ctx, conn)
				} else {
					a.logf("CREATE EXTENSION pg_lease (version %s)", leaseadmin.Version)
					err = leaseadmin.InstallExtension(ctx, conn)
				}
				if err != nil {
					return err
				}
				v, ext, err := leaseadmin.Installed(ctx, conn)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "pg_lease %s installed (%s) in database %s\n", v, installMode(ext), quoteField(conn.Config().Database))
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&schemaOnly, "schema-only", false, "install as a plain schema, without CREATE EXTENSION")
	return cmd
}

// installMode names how pg_lease is installed, as install and version print
// it: "extension" (CREATE EXTENSION) or "schema" (a plain schema).
func installMode(extension bool) string {
	if extension {
		return "extension"
	}
	return "schema"
}

func (a *app) versionCmd() *cobra.Command {
	var client bool
	cmd := &cobra.Command{
		Use:   "version [--client]",
		Short: "Print pglease's version, the SQL it ships, and the database's pg_lease and PostgreSQL versions",
		Args:  args(0, 0, "no arguments"),
		RunE: a.runE("version", func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.stdout, "client:  %s\nships:   pg_lease SQL %s\n", moduleVersion(), leaseadmin.Version)
			if client {
				return nil
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				ctx := cmd.Context()
				var server string
				if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&server); err != nil {
					return err
				}
				// The catalogs only: nothing in schema lease is called.
				in, err := leaseadmin.Describe(ctx, conn)
				sqlv, note := "", ""
				switch {
				case errors.Is(err, lease.ErrNotInstalled):
					sqlv, err = "not installed", nil
				case errors.Is(err, leaseadmin.ErrSquatted):
					sqlv = "not trusted: schema lease is not pg_lease's"
				case err != nil:
					return err
				case !in.Trusted && !in.Extension:
					// A plain schema another role owns is not reported as installed.
					sqlv, err = "not trusted: a plain schema owned by role "+quoteField(in.Owner), in.TrustError()
				default:
					sqlv = in.Version + " (" + installMode(in.Extension) + ")"
					if in.Version != leaseadmin.Version {
						note = fmt.Sprintf("  (differs from the %s this pglease ships)", leaseadmin.Version)
					}
					if !in.Trusted {
						note += fmt.Sprintf("\nowner:   role %s, which %s does not trust: install, cleanup and release --force refuse to run its functions",
							quoteField(in.Owner), a.user())
					}
				}
				fmt.Fprintf(a.stdout, "sql:     %s%s\nserver:  PostgreSQL %s\n", sqlv, note, server)
				return err
			})
		}),
	}
	cmd.Flags().BoolVar(&client, "client", false, "do not connect: print only what this pglease is")
	return cmd
}

const statusHelp = `STATUS is held, lapsed (the grant expired without a release: HOLDER is the
holder whose grant lapsed), released (by its holder or release --force), or free
(not held; a server before pg_lease 0.4.0 does not say whether the key lapsed or
was released). REMAINING is the server-clock time left on a held grant; AGE is
how long the key has been in its STATUS (since the grant, the expiry or the
release). Keys and holders that are not plain printable text are printed
Go-quoted ("a\tb").`

func (a *app) getCmd() *cobra.Command {
	var p printFlags
	cmd := &cobra.Command{
		Use:   "get KEY...",
		Short: "Show keys: holder, status, epoch, remaining time, age",
		Long:  "Show the named keys (one json/yaml object for one key, a list for several).\n\n" + statusHelp,
		Example: `  pglease get job-42
  pglease get job-42 -o json --dsn-file /etc/pglease/dsn`,
		Args: args(1, -1, "at least one KEY"),
		RunE: a.runE("get", func(cmd *cobra.Command, keys []string) error {
			if err := p.check(getFormats); err != nil {
				return err
			}
			for _, k := range keys {
				if err := checkKey(k); err != nil {
					return err
				}
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				states, err := readStates(cmd.Context(), conn, keys)
				if err != nil {
					return err
				}
				byKey := map[string]keyState{}
				for _, s := range states {
					byKey[s.Key] = s
				}
				var found []keyState
				var missing []string
				for _, k := range keys {
					if s, ok := byKey[k]; ok {
						found = append(found, s)
					} else {
						missing = append(missing, quoteField(k))
					}
				}
				if len(found) > 0 {
					if err := printStates(a.stdout, p, found, len(keys) == 1); err != nil {
						return err
					}
				}
				if len(missing) > 0 {
					return fmt.Errorf("%w: %s", errNotFound, strings.Join(missing, ", "))
				}
				return nil
			})
		}),
	}
	p.add(cmd, getFormats)
	return cmd
}

func (a *app) listCmd() *cobra.Command {
	var p printFlags
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "Show every key",
		Long:    "Show every key, ordered by key.\n\n" + statusHelp,
		Args:    args(0, 0, "no arguments (get shows named keys)"),
		RunE: a.runE("list", func(cmd *cobra.Command, _ []string) error {
			if err := p.check(getFormats); err != nil {
				return err
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				states, err := readStates(cmd.Context(), conn, nil)
				if err != nil {
					return err
				}
				return printStates(a.stdout, p, states, false)
			})
		}),
	}
	p.add(cmd, getFormats)
	return cmd
}

func (a *app) releaseCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "release --force KEY",
		Short: "Free a key whatever its holder, fencing that holder (operators)",
		Long: `Free KEY whatever its holder and move its epoch past the holder's grant, so every
guard rejects the old holder from then on (lease.force_release). Holders release
their own grants through their client; this is for operators, and needs --force
and EXECUTE on lease.force_release(text), which is revoked from PUBLIC.
A key that is not held is left as it is (exit 0); a key that was never leased
exits 5, as get does.`,
		Args: args(1, 1, "exactly one KEY"),
		RunE: a.runE("force_release", func(cmd *cobra.Command, keys []string) error {
			key := keys[0]
			if err := checkKey(key); err != nil {
				return err
			}
			if !force {
				return usagef("release needs --force: it frees the key whatever its holder and fences that holder (holders release through their own client)")
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				released, prev, epoch, err := leaseadmin.ForceRelease(cmd.Context(), lease.New(conn), key)
				switch {
				case err != nil:
					return err
				case !released && epoch == 0:
					return fmt.Errorf("%w: %s", errNotFound, quoteField(key))
				case !released:
					fmt.Fprintf(a.stdout, "%s: not held; nothing to release (epoch counter %d)\n", quoteField(key), epoch)
				default:
					fmt.Fprintf(a.stdout, "%s: released (was held by %s); epoch counter now %d, so every epoch below it is fenced\n", quoteField(key), quoteField(prev), epoch)
				}
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&force, "force", false, "required: free the key whatever its holder")
	return cmd
}

func (a *app) cleanupCmd() *cobra.Command {
	var (
		freeFor time.Duration
		maxRows int
	)
	cmd := &cobra.Command{
		Use:   "cleanup --free-for DURATION [--max-rows N]",
		Short: "Delete keys that have been free for at least DURATION (operators)",
		Long: `Delete the rows of keys that have been free (released, or lapsed and not taken
over) for at least --free-for on the server's clock, at most --max-rows of them,
oldest first (lease.cleanup). Epochs never go back: a deleted key that is leased
again gets an epoch above every epoch it had. Needs pg_lease 0.2.0 or later and
EXECUTE on lease.cleanup(interval, integer), which is revoked from PUBLIC.`,
		Example: "  pglease cleanup --free-for 168h",
		Args:    args(0, 0, "no arguments"),
		RunE: a.runE("cleanup", func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("free-for") {
				return usagef("cleanup needs --free-for DURATION (for example 168h): how long a key must have been free")
			}
			if freeFor < 0 {
				return usagef("--free-for %v: must not be negative", freeFor)
			}
			if maxRows < 1 {
				return usagef("--max-rows %d: must be at least 1", maxRows)
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				removed, floor, err := cleanupKeys(cmd.Context(), conn, freeFor, maxRows)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "removed %d key(s) free for at least %v; epoch floor %d (new keys start above it)\n", removed, freeFor, floor)
				return nil
			})
		}),
	}
	cmd.Flags().DurationVar(&freeFor, "free-for", 0, "delete keys free for at least this long (required), e.g. 168h")
	cmd.Flags().IntVar(&maxRows, "max-rows", 10000, "delete at most this many keys")
	return cmd
}

// cleanupKeys is leaseadmin.Cleanup (which calls nothing unless this role
// can trust the install), naming an install without lease.cleanup (before
// 0.2.0) and its fix.
func cleanupKeys(ctx context.Context, conn *pgx.Conn, freeFor time.Duration, maxRows int) (removed, floor int64, err error) {
	removed, floor, err = leaseadmin.Cleanup(ctx, lease.New(conn), freeFor, maxRows)
	if ve := (*leaseadmin.VersionError)(nil); errors.As(err, &ve) {
		return 0, 0, &incompatibleError{
			msg:  ve.Error(),
			hint: fmt.Sprintf("update it with `pglease install` (this pglease ships %s)", leaseadmin.Version),
		}
	}
	return removed, floor, err
}

func (a *app) statusCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status [-o json]",
		Short: "Show the database's max_ttl, promotion mode, and the promotion grace in force",
		Long: `Show lease.status(): the largest TTL accepted (max_ttl), the promotion mode
(any: a grace of max_ttl after a promotion or a restart of the server;
synchronous: none), the grace a promotion seen now would impose, the WAL
timeline and epoch era last recorded, and whether the grace of the last
promotion or restart is still in force and when it ends: no new grant of any
key is made before then (renewals go on).`,
		Example: "  pglease status\n  pglease status -o json",
		Args:    args(0, 0, "no arguments"),
		RunE: a.runE("status", func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" {
				return usagef("-o %s: want json (or nothing for text)", output)
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				s, err := leaseadmin.ReadSettings(cmd.Context(), lease.New(conn))
				if err != nil {
					return err
				}
				if output == "json" {
					type row struct {
						MaxTTLSeconds         float64    `json:"max_ttl_seconds"`
						Promotion             string     `json:"promotion"`
						PromotionGraceSeconds float64    `json:"promotion_grace_seconds"`
						Timeline              int64      `json:"timeline"`
						Era                   int64      `json:"era"`
						GraceUntil            *time.Time `json:"grace_until"`
						GraceLeftSeconds      float64    `json:"grace_left_seconds"`
						EpochFloor            int64      `json:"epoch_floor"`
						ServerTime            time.Time  `json:"server_time"`
					}
					r := row{MaxTTLSeconds: s.MaxTTL.Seconds(), Promotion: s.Promotion,
						PromotionGraceSeconds: s.PromotionGrace.Seconds(), Timeline: s.Timeline, Era: s.Era,
						GraceLeftSeconds: s.GraceLeft().Seconds(), EpochFloor: s.EpochFloor, ServerTime: s.ServerNow.UTC()}
					if !s.GraceUntil.IsZero() {
						g := s.GraceUntil.UTC()
						r.GraceUntil = &g
					}
					return writeStructured(a.stdout, "json", r)
				}
				grace := "none in force"
				if left := s.GraceLeft(); left > 0 {
					grace = fmt.Sprintf("no new grant until %s (%s left)", s.GraceUntil.UTC().Format(time.RFC3339Nano), left.Round(time.Millisecond))
				}
				fmt.Fprintf(a.stdout, "max_ttl:          %s\npromotion:        %s\npromotion grace:  %s (what a promotion seen now imposes)\ntimeline:         %d (era %d)\ngrace:            %s\nepoch floor:      %d\n",
					s.MaxTTL, s.Promotion, s.PromotionGrace, s.Timeline, s.Era, grace, s.EpochFloor)
				return nil
			})
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json, or nothing for text")
	return cmd
}

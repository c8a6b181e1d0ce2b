package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Output formats of history and health.
var historyFormats = []string{"table", "wide", "json", "yaml"}

// eventRow is one event as history prints it in json and yaml.
type eventRow struct {
	Seq           int64      `json:"seq"`
	At            time.Time  `json:"at"`
	Event         string     `json:"event"`
	Owner         string     `json:"owner,omitempty"`
	Role          string     `json:"role,omitempty"`
	Epoch         int64      `json:"epoch,omitempty"`
	Actor         string     `json:"actor"`
	PreviousOwner string     `json:"previousOwner,omitempty"`
	PreviousEpoch int64      `json:"previousEpoch,omitempty"`
	VacantSince   *time.Time `json:"vacantSince,omitempty"`
	TTLSeconds    float64    `json:"ttlSeconds,omitempty"`
	Detail        string     `json:"detail,omitempty"`
}

func (a *app) historyCmd() *cobra.Command {
	var (
		p     printFlags
		limit int
	)
	cmd := &cobra.Command{
		Use:   "history KEY [--limit N] [-o FORMAT]",
		Short: "Show a key's last leadership changes and their reasons",
		Long: `Show the last recorded changes of KEY's leadership, oldest first (lease.history,
pg_lease 0.4.0 or later): each grant (acquired: the key was free; taken_over: the
previous grant lapsed without a release), release, forced release (release
--force), and promotion grace (no new grant during the grace after a timeline
change or, from pg_lease 0.5.0, a restart of the server: its reason names which). OWNER, ROLE and EPOCH are the grant the event concerns; BY is the
database role whose call made it. VACANT is how long the key had no holder before
a grant. The database keeps the last events of each key (100 unless an operator
set another number with lease.configure_history). A key that was never leased
exits 5.`,
		Example: "  pglease history my-controller\n  pglease history my-controller --limit 20 -o json",
		Args:    args(1, 1, "exactly one KEY"),
		RunE: a.runE("history", func(cmd *cobra.Command, keys []string) error {
			key := keys[0]
			if err := checkKey(key); err != nil {
				return err
			}
			if err := p.check(historyFormats); err != nil {
				return err
			}
			if limit < 1 || limit > 10000 {
				return usagef("--limit %d: want 1 to 10000", limit)
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				ctx := cmd.Context()
				c := lease.New(conn)
				events, err := leaseadmin.History(ctx, c, key, limit)
				if err != nil {
					return needsHistory(ctx, conn, "history", err)
				}
				if len(events) == 0 {
					st, err := c.Inspect(ctx, key)
					if err != nil {
						return err
					}
					if !st.Exists {
						return fmt.Errorf("%w: %s", errNotFound, quoteField(key))
					}
				}
				var now time.Time
				if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
					return err
				}
				return printHistory(a.stdout, p, events, now)
			})
		}),
	}
	p.add(cmd, historyFormats)
	cmd.Flags().IntVarP(&limit, "limit", "n", 20, "show at most the last N events (1 to 10000)")
	return cmd
}

// eventDetail says in words what a table row's columns do not.
func eventDetail(e leaseadmin.HistoryEvent) string {
	var parts []string
	if e.Kind == leaseadmin.HistoryTakenOver && e.PreviousOwner != "" {
		parts = append(parts, fmt.Sprintf("the grant of %s (epoch %d) had lapsed", quoteField(e.PreviousOwner), e.PreviousEpoch))
	}
	if e.Actor != "" && e.Actor != e.Role && e.Kind != leaseadmin.HistoryPromotionGrace {
		parts = append(parts, "by role "+quoteField(e.Actor))
	}
	if e.Detail != "" {
		parts = append(parts, safeLine(e.Detail))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func printHistory(w io.Writer, p printFlags, events []leaseadmin.HistoryEvent, now time.Time) error {
	switch p.output {
	case "json", "yaml":
		rows := make([]eventRow, 0, len(events))
		for _, e := range events {
			rows = append(rows, eventRow{
				Seq: e.Seq, At: e.At.UTC(), Event: e.Kind, Owner: e.Owner, Role: e.Role, Epoch: e.Epoch,
				Actor: e.Actor, PreviousOwner: e.PreviousOwner, PreviousEpoch: e.PreviousEpoch,
				VacantSince: tp(e.VacantSince), TTLSeconds: e.TTL.Seconds(), Detail: e.Detail,
			})
		}
		return writeStructured(w, p.output, rows)
	}
	wide := p.output == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if !p.noHeaders {
		h := "SEQ\tAGE\tEVENT\tOWNER\tROLE\tEPOCH\tVACANT\tDETAIL"
		if wide {
			h += "\tAT\tTTL\tBY"
		}
		fmt.Fprintln(tw, h)
	}
	for _, e := range events {
		owner, role, epoch := "-", "-", "-"
		if e.Owner != "" {
			owner = quoteField(e.Owner)
		}
		if e.Role != "" {
			role = quoteField(e.Role)
		}
		if e.Epoch != 0 {
			epoch = fmt.Sprint(e.Epoch)
		}
		vacant := "-"
		if !e.VacantSince.IsZero() {
			vacant = compactDuration(e.At.Sub(e.VacantSince))
		}
		line := fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s", e.Seq, human(now.Sub(e.At), true), e.Kind,
			owner, role, epoch, vacant, eventDetail(e))
		if wide {
			ttl := "-"
			if e.TTL > 0 {
				ttl = e.TTL.String()
			}
			line += "\t" + stamp(e.At) + "\t" + ttl + "\t" + quoteField(e.Actor)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// compactDuration prints a duration to the millisecond below a minute
// (a handover's vacancy is milliseconds), as kubectl's AGE above.
func compactDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return human(d, true)
}

// healthRow is one key as health prints it in json and yaml.
type healthRow struct {
	Key                 string     `json:"key"`
	Held                bool       `json:"held"`
	Holder              string     `json:"holder,omitempty"`
	Role                string     `json:"role,omitempty"`
	Epoch               int64      `json:"epoch"`
	TermStarted         *time.Time `json:"termStarted,omitempty"`
	TermSeconds         float64    `json:"termSeconds"`
	VacantSince         *time.Time `json:"vacantSince,omitempty"`
	LeaderlessSeconds   float64    `json:"leaderlessSeconds"`
	TTLSeconds          float64    `json:"ttlSeconds,omitempty"`
	Grants              *int64     `json:"grants,omitempty"`
	PeriodSeconds       float64    `json:"periodSeconds"`
	Transitions         int64      `json:"transitions"`
	PeriodLeaderlessSec float64    `json:"periodLeaderlessSeconds"`
	HistorySince        *time.Time `json:"historySince,omitempty"`
	ServerTime          time.Time  `json:"serverTime"`
}

func (a *app) healthCmd() *cobra.Command {
	var (
		p      printFlags
		period time.Duration
	)
	cmd := &cobra.Command{
		Use:   "health [KEY...] [--period DURATION] [-o FORMAT]",
		Short: "Show every key's leader, term, and time without a leader",
		Long: `Show, for every key (or the named ones), its holder, epoch and term age, how long
it has had no holder, and within the last --period the new terms (TERMS) and the
time with no holder (LEADERLESS), read from the database's history (lease.health,
pg_lease 0.4.0 or later). The period sees only the history the database keeps:
HISTORY-SINCE (wide) is its oldest event. Exits 5 when a named key was never
leased.`,
		Example: "  pglease health\n  pglease health my-controller --period 24h -o json",
		RunE: a.runE("health", func(cmd *cobra.Command, keys []string) error {
			for _, k := range keys {
				if err := checkKey(k); err != nil {
					return err
				}
			}
			if err := p.check(historyFormats); err != nil {
				return err
			}
			if period < time.Second || period > 366*24*time.Hour {
				return usagef("--period %v: want 1s to 366 days", period)
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				all, err := leaseadmin.Health(cmd.Context(), lease.New(conn), period)
				if err != nil {
					return needsHistory(cmd.Context(), conn, "health", err)
				}
				hs := all
				if len(keys) > 0 {
					byKey := map[string]leaseadmin.KeyHealth{}
					for _, h := range all {
						byKey[h.Key] = h
					}
					hs = nil
					for _, k := range keys {
						h, ok := byKey[k]
						if !ok {
							return fmt.Errorf("%w: %s", errNotFound, quoteField(k))
						}
						hs = append(hs, h)
					}
				}
				return printHealth(a.stdout, p, hs, period)
			})
		}),
	}
	p.add(cmd, historyFormats)
	cmd.Flags().DurationVar(&period, "period", time.Hour, "window of TERMS and LEADERLESS (1s to 366 days)")
	return cmd
}

func printHealth(w io.Writer, p printFlags, hs []leaseadmin.KeyHealth, period time.Duration) error {
	switch p.output {
	case "json", "yaml":
		rows := make([]healthRow, 0, len(hs))
		for _, h := range hs {
			r := healthRow{
				Key: h.Key, Held: h.Held, Holder: h.Owner, Role: h.Role, Epoch: h.Epoch,
				TermStarted: tp(h.TermStarted), TermSeconds: h.TermAge.Seconds(),
				VacantSince: tp(h.VacantSince), LeaderlessSeconds: h.Vacant.Seconds(), TTLSeconds: h.TTL.Seconds(),
				PeriodSeconds: period.Seconds(), Transitions: h.Transitions, PeriodLeaderlessSec: h.Leaderless.Seconds(),
				HistorySince: tp(h.HistorySince), ServerTime: h.ServerNow.UTC(),
			}
			if h.HasHistory {
				g := h.Grants
				r.Grants = &g
			}
			rows = append(rows, r)
		}
		return writeStructured(w, p.output, rows)
	}
	wide := p.output == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if !p.noHeaders {
		per := human(period, true)
		h := fmt.Sprintf("KEY\tHOLDER\tEPOCH\tTERM\tNO-LEADER-FOR\tTERMS/%s\tLEADERLESS/%s", per, per)
		if wide {
			h += "\tROLE\tTTL\tGRANTS\tHISTORY-SINCE"
		}
		fmt.Fprintln(tw, h)
	}
	for _, h := range hs {
		holder, term, vacant := "<none>", "-", "-"
		if h.Held {
			holder, term = quoteField(h.Owner), human(h.TermAge, true)
		} else {
			vacant = compactDuration(h.Vacant)
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%d\t%s", quoteField(h.Key), holder, h.Epoch, term, vacant,
			h.Transitions, compactDuration(h.Leaderless))
		if wide {
			role, ttl, grants := "-", "-", "-"
			if h.Role != "" {
				role = quoteField(h.Role)
			}
			if h.TTL > 0 {
				ttl = h.TTL.String()
			}
			if h.HasHistory {
				grants = fmt.Sprint(h.Grants)
			}
			line += "\t" + role + "\t" + ttl + "\t" + grants + "\t" + stamp(h.HistorySince)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

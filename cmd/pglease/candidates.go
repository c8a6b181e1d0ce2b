package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Output formats of candidates.
var candidateFormats = []string{"table", "json", "yaml", "name"}

func (a *app) candidatesCmd() *cobra.Command {
	var p printFlags
	cmd := &cobra.Command{
		Use:   "candidates KEY",
		Short: "Show a key's handover strategy and its candidates",
		Long: `Show the handover strategy that the connecting database role set on KEY and
the candidates registered for it, in the order a release by that role would
choose them (RANK 1 first). A candidate without a rank cannot be chosen now:
not live (its registration lapsed or its connection ended), not ready, without
a version under a version strategy, registered by a role the connecting role
is not a member of, or the strategy is any (a release frees the key and the
waiters race).`,
		Args: args(1, 1, "exactly one KEY"),
		RunE: a.runE("candidates", func(cmd *cobra.Command, keys []string) error {
			key := keys[0]
			if err := checkKey(key); err != nil {
				return err
			}
			if err := p.check(candidateFormats); err != nil {
				return err
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				strategy, cs, err := handover.Candidates(cmd.Context(), lease.New(conn), key)
				if err != nil {
					return err
				}
				return printCandidates(a.stdout, p, key, strategy, cs)
			})
		}),
	}
	p.add(cmd, candidateFormats)
	return cmd
}

// candidateRow is one candidate as candidates prints it in json and yaml.
type candidateRow struct {
	Owner        string    `json:"owner"`
	Version      string    `json:"version,omitempty"`
	Priority     int32     `json:"priority"`
	Ready        bool      `json:"ready"`
	Live         bool      `json:"live"`
	Rank         int64     `json:"rank,omitempty"`
	RegisteredAt time.Time `json:"registeredAt"`
	ExpiresAt    time.Time `json:"expiresAt"`
}

func printCandidates(w io.Writer, p printFlags, key string, strategy handover.Strategy, cs []handover.CandidateState) error {
	switch p.output {
	case "json", "yaml":
		v := struct {
			Key        string         `json:"key"`
			Strategy   string         `json:"strategy"`
			Candidates []candidateRow `json:"candidates"`
		}{Key: key, Strategy: string(strategy), Candidates: []candidateRow{}}
		for _, c := range cs {
			v.Candidates = append(v.Candidates, candidateRow{Owner: c.Owner, Version: c.Version, Priority: c.Priority,
				Ready: c.Ready, Live: c.Live, Rank: c.Rank, RegisteredAt: c.RegisteredAt, ExpiresAt: c.ExpiresAt})
		}
		return writeStructured(w, p.output, v)
	case "name":
		for _, c := range cs {
			if _, err := fmt.Fprintln(w, quoteField(c.Owner)); err != nil {
				return err
			}
		}
		return nil
	}
	if !p.noHeaders {
		fmt.Fprintf(w, "%s: strategy %s\n", quoteField(key), strategy)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if !p.noHeaders {
		fmt.Fprintln(tw, "RANK\tCANDIDATE\tVERSION\tPRIORITY\tREADY\tLIVE\tREGISTERED")
	}
	for _, c := range cs {
		rank, version := "-", "-"
		if c.Rank > 0 {
			rank = strconv.FormatInt(c.Rank, 10)
		}
		if c.Version != "" {
			version = quoteField(c.Version)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\t%v\t%s\n", rank, quoteField(c.Owner), version, c.Priority, c.Ready, c.Live, stamp(c.RegisteredAt))
	}
	return tw.Flush()
}

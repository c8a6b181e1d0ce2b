package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/shard"
)

func (a *app) shardsCmd() *cobra.Command {
	var n int
	cmd := &cobra.Command{
		Use:   "shards CONTROLLER [--shards N]",
		Short: "Show a sharded controller's members, who owns each shard, and the shards owned by nobody",
		Long: `Show the members of a controller sharded with pkg/shard (replicas holding
CONTROLLER/member/ID), the shards each owns, and every shard key
(CONTROLLER/shard/S): its holder, epoch and time left, and the member the
balanced assignment gives it to. A shard held by nobody is "unowned"; one held by another
member than its assigned one is being handed over ("moving"). Without --shards,
N is the highest shard key seen plus one.`,
		Args: args(1, 1, "exactly one CONTROLLER"),
		RunE: a.runE("shards", func(cmd *cobra.Command, argv []string) error {
			controller := argv[0]
			if err := checkKey(controller); err != nil {
				return err
			}
			if n < 0 || n > shard.MaxShards {
				return usagef("--shards %d: want 1 to %d (0: infer)", n, shard.MaxShards)
			}
			return a.withConn(cmd.Context(), func(conn *pgx.Conn) error {
				v, err := shard.Read(cmd.Context(), lease.New(conn), controller, n)
				if err != nil {
					return err
				}
				a.printShards(v)
				return nil
			})
		}),
	}
	cmd.Flags().IntVar(&n, "shards", 0, "number of shards N (0: infer from the keys)")
	return cmd
}

func (a *app) printShards(v shard.View) {
	owned := map[string]int{}
	unowned, moving := 0, 0
	for _, s := range v.Shards {
		switch {
		case !s.Owned():
			unowned++
		case s.Misplaced():
			moving++
		}
		if s.Owned() {
			owned[s.Member]++
		}
	}
	fmt.Fprintf(a.stdout, "controller %s: %d shards, %d members, %d unowned, %d moving\n",
		quoteField(v.Controller), len(v.Shards), len(v.Members), unowned, moving)
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MEMBER\tOWNS\tASSIGNED")
	assigned := map[string]int{}
	for _, s := range v.Shards {
		assigned[s.Assigned]++
	}
	for _, m := range v.Members {
		fmt.Fprintf(w, "%s\t%d\t%d\n", quoteField(m), owned[m], assigned[m])
	}
	_ = w.Flush()
	fmt.Fprintln(a.stdout)
	w = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SHARD\tSTATUS\tOWNER\tEPOCH\tEXPIRES IN\tASSIGNED")
	for _, s := range v.Shards {
		status, owner, left := "unowned", "-", "-"
		switch {
		case s.Misplaced():
			status = "moving"
		case s.Owned():
			status = "owned"
		}
		if s.Owned() {
			owner = quoteField(s.State.Owner)
			left = s.State.ExpiresAt.Sub(s.State.ServerNow).Round(time.Millisecond).String()
		}
		assignedTo := "-"
		if s.Assigned != "" {
			assignedTo = quoteField(s.Assigned)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", s.Shard, status, owner, s.State.Epoch, left, assignedTo)
	}
	_ = w.Flush()
}

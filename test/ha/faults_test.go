package ha

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/patroni"
)

// Faults of the HA manager itself, not of the primary alone.
const (
	// faultEtcd: the primary crashes and, as soon as a replica is
	// promoted, etcd (Patroni's DCS) is stopped; it is started again once
	// the promoted node has demoted itself (it cannot keep its leader key
	// without the DCS), and the cluster settles on whichever node Patroni
	// then promotes.
	faultEtcd = "etcd-lost"
	// faultPatroni: the primary's Patroni is killed; its PostgreSQL keeps
	// running, without an HA manager, while another node is promoted. The
	// Patroni is then started again and demotes it. Opt-in: Patroni 3.0.2,
	// started again, first reloads that PostgreSQL without its synchronous
	// standby (sync mode) or with any standby as synchronous (strict mode),
	// so it acknowledges commits the promoted node never gets.
	faultPatroni = "patroni-killed"
	// faultMidCommit: a switchover while the electors' commits on the old
	// primary are in flight (each held holdCommit at commit time).
	faultMidCommit = "mid-commit"
)

// holdCommit is how long each commit that changes a lease row or makes a
// fenced write waits at commit time on the old primary during faultMidCommit.
const holdCommit = 500 * time.Millisecond

// etcdOutageMax bounds etcd's outage when the promoted node does not demote
// itself.
const etcdOutageMax = 10 * time.Second

// selectedFaults is $PGLEASE_HA_FAULTS (comma-separated), else every kind
// but the opt-in ones.
func selectedFaults(t *testing.T) []string {
	v := os.Getenv("PGLEASE_HA_FAULTS")
	if v == "" {
		return faults
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		f := strings.TrimSpace(s)
		if all := append(slices.Clone(faults), optInFaults...); !slices.Contains(all, f) {
			t.Fatalf("PGLEASE_HA_FAULTS: unknown fault %q (%s)", f, strings.Join(all, ", "))
		}
		out = append(out, f)
	}
	return out
}

// holdSQL makes every commit that inserts, updates or deletes a row of
// lease.leases or ha_writes wait, at commit time, for the interval
// ha_commit_hold names for the server's port: a deferred constraint
// trigger, which runs in the commit. Nothing waits while the table is empty.
const holdSQL = `
CREATE TABLE ha_commit_hold (port integer PRIMARY KEY, hold interval NOT NULL);
CREATE FUNCTION ha_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d interval;
BEGIN
  SELECT h.hold INTO d FROM public.ha_commit_hold h WHERE h.port = inet_server_port();
  IF d IS NOT NULL THEN PERFORM pg_sleep_for(d); END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER ha_hold_commit AFTER INSERT OR UPDATE OR DELETE ON lease.leases
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.ha_hold_commit();
CREATE CONSTRAINT TRIGGER ha_hold_commit AFTER INSERT OR UPDATE OR DELETE ON ha_writes
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.ha_hold_commit();`

// etcdLost runs faultEtcd from the healthy primary old.
func (w *world) etcdLost(ctx context.Context, old *patroni.Node) (sample, error) {
	t0 := time.Now()
	if err := old.Kill(); err != nil {
		return sample{}, err
	}
	first, err := w.probe.await(withTimeout(ctx, 2*time.Minute), t0, old)
	if err != nil {
		return sample{}, err
	}
	if err := w.c.StopEtcd(); err != nil {
		return sample{}, err
	}
	stopped := time.Now()
	// The promoted node demotes itself when it cannot update its leader key.
	demoted, derr := w.probe.awaitDemotion(withTimeout(ctx, etcdOutageMax), first.node, stopped)
	restarted := time.Now()
	if err := w.c.StartEtcd(ctx); err != nil {
		return sample{}, err
	}
	if err := old.Start(withTimeout(ctx, 2*time.Minute)); err != nil {
		return sample{}, err
	}
	leader, err := w.c.WaitHealthy(withTimeout(ctx, 3*time.Minute))
	if err != nil {
		return sample{}, err
	}
	// The promotion the keys waited for: the leader's last one.
	p, ok := w.probe.last(leader, t0)
	if !ok {
		return sample{}, fmt.Errorf("no promotion of the leader %s seen since the fault", leader.Name)
	}
	how := "was not demoted"
	if derr == nil {
		how = fmt.Sprintf("demoted itself %v after etcd stopped", demoted.Sub(stopped).Round(time.Millisecond))
	}
	w.t.Logf("etcd stopped %v after %s's promotion, for %v; %s %s; the cluster settled on %s",
		stopped.Sub(first.at).Round(time.Millisecond), first.node.Name, restarted.Sub(stopped).Round(time.Millisecond),
		first.node.Name, how, leader.Name)
	s, err := w.measureFrom(ctx, t0, old, p, nil)
	return s, err
}

// patroniKilled runs faultPatroni from the healthy primary old.
func (w *world) patroniKilled(ctx context.Context, old *patroni.Node) (sample, error) {
	t0 := time.Now()
	if err := old.KillPatroni(); err != nil {
		return sample{}, err
	}
	// Its PostgreSQL runs on as a primary until its Patroni, started again
	// once another node leads, demotes it.
	s, _, err := w.measure(ctx, t0, old, func() error { return old.Start(withTimeout(ctx, 2*time.Minute)) })
	if err != nil {
		return s, err
	}
	_, err = w.c.WaitHealthy(withTimeout(ctx, 3*time.Minute))
	return s, err
}

// midCommit runs faultMidCommit from the healthy primary old: commits on
// old are held at commit time, and once one was seen held, Patroni
// switches over. It reports how many of the candidates' commits the
// switchover cut (sent to old, answered by an error).
func (w *world) midCommit(ctx context.Context, old *patroni.Node) (sample, error) {
	conn, err := old.Connect(ctx, dbName)
	if err != nil {
		return sample{}, err
	}
	defer conn.Close(context.Background())
	set := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO ha_commit_hold (port, hold) VALUES ($1, $2::interval)`,
		old.Port, fmt.Sprintf("%d milliseconds", holdCommit.Milliseconds())); err != nil {
		return sample{}, err
	}
	// A commit seen held: a fenced write's commit that took the hold.
	if err := w.calls.await(withTimeout(ctx, time.Minute), func(c call) bool {
		return c.ok && c.kind == "commit" && c.port == old.Port && c.start.After(set) && c.end.Sub(c.start) >= holdCommit
	}); err != nil {
		return sample{}, fmt.Errorf("no commit held on %s: %w", old.Name, err)
	}
	// patronictl answers once the old primary has rejoined, which the
	// held commits and a loaded machine can make slow: the promotion is
	// measured as soon as it is seen, patronictl's answer awaited after.
	cand, err := w.candidate(ctx, old)
	if err != nil {
		return sample{}, err
	}
	t0 := time.Now()
	switched := make(chan error, 1)
	go func() { switched <- w.c.Switchover(withTimeout(ctx, 5*time.Minute), old, cand) }()
	s, next, err := w.measure(ctx, t0, old, nil)
	err = joinErr(err, <-switched)
	if err == nil && next != cand {
		err = fmt.Errorf("switchover to %s promoted %s", cand.Name, next.Name)
	}
	if err != nil {
		return s, err
	}
	cut := w.calls.cut(old.Port, set)
	w.t.Logf("mid-commit: %d of the candidates' calls on %s were cut by the switchover (%s)", cut.n, old.Name, cut.kinds)
	s.cut = cut.n
	// The hold names the old primary's port: nothing waits on the new one.
	c2, err := next.Connect(ctx, dbName)
	if err != nil {
		return s, err
	}
	defer c2.Close(context.Background())
	_, err = c2.Exec(ctx, `DELETE FROM ha_commit_hold`)
	return s, err
}

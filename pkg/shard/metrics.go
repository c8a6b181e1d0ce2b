package shard

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics of every Sharder of the process, registered in controller-runtime's
// registry (sigs.k8s.io/controller-runtime/pkg/metrics.Registry, served on a
// manager's metrics endpoint). Register them elsewhere with Collectors.
//
//	pg_lease_shard_owned{controller,member}                  shards this replica holds
//	pg_lease_shard_members{controller,member}                live members this replica saw at its last read
//	pg_lease_shard_unowned{controller,member}                shards nobody held at its last read
//	pg_lease_shard_unowned_seconds_total{controller,member}  shard-seconds nobody held a shard, summed
//	                                                         over consecutive reads that both saw it unowned
//	pg_lease_shard_rebalances_total{controller,member,kind}  shards acquired, released (moved or stopped),
//	                                                         and lost (renewal refused or local deadline)
//
// Every replica reports the unowned gauges of the whole controller: alert on
// their max over members ("owned by nobody" for longer than a few TTLs).
var (
	ownedVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pg_lease_shard_owned", Help: "Shards this replica holds.",
	}, []string{"controller", "member"})
	membersVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pg_lease_shard_members", Help: "Live members this replica saw at its last read.",
	}, []string{"controller", "member"})
	unownedVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pg_lease_shard_unowned", Help: "Shards of the controller nobody held at this replica's last read.",
	}, []string{"controller", "member"})
	unownedSecondsVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pg_lease_shard_unowned_seconds_total",
		Help: "Shard-seconds no replica held a shard, between consecutive reads of this replica that both saw it unowned.",
	}, []string{"controller", "member"})
	rebalancesVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pg_lease_shard_rebalances_total",
		Help: "Shards this replica acquired, released (moved away or stopped) and lost.",
	}, []string{"controller", "member", "kind"})
)

// Collectors returns the package's metrics, for a registry other than
// controller-runtime's.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{ownedVec, membersVec, unownedVec, unownedSecondsVec, rebalancesVec}
}

func init() {
	metrics.Registry.MustRegister(Collectors()...)
}

type replicaMetrics struct {
	owned, members, unowned prometheus.Gauge
	unownedSeconds          prometheus.Counter
	rebalances              *prometheus.CounterVec
}

func newReplicaMetrics(controller, member string) *replicaMetrics {
	l := prometheus.Labels{"controller": controller, "member": member}
	return &replicaMetrics{
		owned:          ownedVec.With(l),
		members:        membersVec.With(l),
		unowned:        unownedVec.With(l),
		unownedSeconds: unownedSecondsVec.With(l),
		rebalances:     rebalancesVec.MustCurryWith(l),
	}
}

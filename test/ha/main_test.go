// Package ha runs pg_lease under a real HA manager: Patroni with etcd, three
// PostgreSQL nodes on loopback, in asynchronous, synchronous and strict
// synchronous mode, with electors (pkg/elector, client-go with
// pkg/resourcelock, controller-runtime managers) connected through a
// multi-host DSN, while Patroni switches over and fails over. See README.md.
package ha

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/pglease/pg_lease/internal/kubetest"
	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) {
	// client-go's elector logs every failed renewal through klog: during
	// failovers that is most of the output. The test records what matters.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	ctrllog.SetLogger(logr.Discard())
	pgtest.Main(m)
}

// supervisePkg is the reaper each Patroni runs under.
const supervisePkg = "github.com/pglease/pg_lease/internal/patroni/supervise"

// etcdBinary is the test control plane's etcd (kubetest.Assets: the same
// binary the end-to-end suite runs), or $PGLEASE_ETCD.
func etcdBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PGLEASE_ETCD"); p != "" {
		return p
	}
	dir, err := kubetest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "etcd")
}

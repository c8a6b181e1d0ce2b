// Package deps pins the module's direct dependencies while the packages that
// use them are being written. It is removed once every dependency has a real
// importer.
package deps

import (
	_ "github.com/anishathalye/porcupine"
	_ "github.com/go-logr/logr"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.uber.org/goleak"
	_ "k8s.io/client-go/tools/leaderelection"
	_ "k8s.io/client-go/tools/leaderelection/resourcelock"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
	_ "sigs.k8s.io/controller-runtime/pkg/healthz"
	_ "sigs.k8s.io/controller-runtime/pkg/metrics"
	_ "sigs.k8s.io/yaml"
)

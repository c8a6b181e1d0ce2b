package e2e

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pglease/pg_lease/internal/kubetest"
)

// wantKubernetesVersion is the version hack/controlplane builds and the
// version the server must report (set through -ldflags by the build script).
const wantKubernetesVersion = "v1.37.2"

// StartControlPlane returns the control plane that the tests of this
// binary share (kubetest.Shared; TestMain stops it): starting one per test
// cost 5-25 s each. Every test keeps to a namespace or object names of its
// own, and the control plane runs no controllers, so no test sees another's
// objects act.
func StartControlPlane(t testing.TB) *rest.Config { return kubetest.Shared(t) }

func repoRoot() (string, error) { return kubetest.RepoRoot() }

func tail(path string) string { return kubetest.Tail(path) }

func TestControlPlaneStarts(t *testing.T) {
	cfg := StartControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if info.GitVersion != wantKubernetesVersion {
		t.Errorf("server reports %q, want %q", info.GitVersion, wantKubernetesVersion)
	}

	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pg-lease-e2e"},
		Data:       map[string]string{"hello": "world"},
	}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatalf("create ConfigMap: %v", err)
	}
	var gotCM corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &gotCM); err != nil {
		t.Fatalf("get ConfigMap: %v", err)
	}
	if gotCM.Data["hello"] != "world" || gotCM.UID == "" || gotCM.ResourceVersion == "" {
		t.Errorf("ConfigMap read back as %+v", gotCM)
	}

	holder := "pg-lease-e2e-holder"
	duration := int32(15)
	now := metav1.NewMicroTime(time.Now().Truncate(time.Microsecond))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pg-lease-e2e"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &duration,
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatalf("create Lease: %v", err)
	}
	var gotLease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKeyFromObject(lease), &gotLease); err != nil {
		t.Fatalf("get Lease: %v", err)
	}
	s := gotLease.Spec
	switch {
	case s.HolderIdentity == nil || *s.HolderIdentity != holder:
		t.Errorf("Lease holder read back as %v, want %q", s.HolderIdentity, holder)
	case s.LeaseDurationSeconds == nil || *s.LeaseDurationSeconds != duration:
		t.Errorf("Lease duration read back as %v, want %d", s.LeaseDurationSeconds, duration)
	case s.RenewTime == nil || !s.RenewTime.Equal(&now):
		t.Errorf("Lease renewTime read back as %v, want %v", s.RenewTime, now)
	}
}

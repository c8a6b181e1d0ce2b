package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestManifestsServerSideDryRun renders config/ (kustomize build
// config/default) and applies every object to a real kube-apiserver with
// server-side apply and dry run, so that the API server validates them
// (schemas, field validation Strict, admission) without persisting them.
// The namespace is created for real first: a dry run cannot create objects
// in a namespace that does not exist.
func TestManifestsServerSideDryRun(t *testing.T) {
	cfg := StartControlPlane(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	if len(objs) < 8 {
		t.Fatalf("rendered %d objects, want at least 8", len(objs))
	}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			if err := c.Create(ctx, u.DeepCopy()); err != nil {
				t.Fatalf("creating Namespace %s: %v", u.GetName(), err)
			}
		}
	}
	kinds := map[string]bool{}
	for _, u := range objs {
		err := c.Patch(ctx, u, client.Apply, client.DryRunAll, client.FieldOwner("pglease-e2e"), client.ForceOwnership)
		if err != nil {
			t.Errorf("server-side dry-run apply of %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
			continue
		}
		kinds[u.GetKind()] = true
	}
	for _, want := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "Secret", "Deployment", "Service", "PodDisruptionBudget"} {
		if !kinds[want] {
			t.Errorf("no %s accepted by the API server (accepted: %v)", want, kinds)
		}
	}
	// Dry run: nothing but the namespace exists.
	var u unstructured.Unstructured
	u.SetAPIVersion("apps/v1")
	u.SetKind("Deployment")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "pglease-system", Name: "pglease-controller-manager"}, &u); err == nil {
		t.Error("the dry run created the Deployment")
	}
}

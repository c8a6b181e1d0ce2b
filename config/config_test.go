// Package config holds the Kubernetes manifests (kustomize) of the
// controller-runtime manager example; its test builds and checks them.
package config

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// build runs kustomize (the library behind `kubectl kustomize`) on this
// folder and decodes every object with the Kubernetes API types, so an
// unknown field or kind fails here.
func build(t *testing.T) []runtime.Object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(clientgoscheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decoding %s: %v", doc, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

func TestManifests(t *testing.T) {
	objs := build(t)
	var (
		dep     *appsv1.Deployment
		sa      *corev1.ServiceAccount
		secret  *corev1.Secret
		role    *rbacv1.Role
		binding *rbacv1.RoleBinding
	)
	for _, o := range objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			dep = v
		case *corev1.ServiceAccount:
			sa = v
		case *corev1.Secret:
			secret = v
		case *rbacv1.Role:
			role = v
		case *rbacv1.RoleBinding:
			binding = v
		case *corev1.Namespace:
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	if dep == nil || sa == nil || secret == nil || role == nil || binding == nil {
		t.Fatalf("missing objects: deployment %v, serviceaccount %v, secret %v, role %v, rolebinding %v",
			dep != nil, sa != nil, secret != nil, role != nil, binding != nil)
	}
	ns := dep.Namespace
	for _, meta := range []string{sa.Namespace, secret.Namespace, role.Namespace, binding.Namespace} {
		if meta != ns {
			t.Errorf("objects in different namespaces: %q vs %q", meta, ns)
		}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The DSN comes from the Secret, never from a literal.
	var dsnFromSecret bool
	for _, e := range c.Env {
		if e.Name == "PGLEASE_DSN" {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("PGLEASE_DSN is not taken from a Secret: %+v", e)
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			if _, ok := secret.StringData[ref.Key]; ref.Name != secret.Name || !ok {
				t.Errorf("PGLEASE_DSN refers to %s/%s, the Secret is %s with keys %v", ref.Name, ref.Key, secret.Name, secret.StringData)
			}
			dsnFromSecret = true
		}
	}
	if !dsnFromSecret {
		t.Error("no PGLEASE_DSN from the Secret")
	}

	// RBAC: only ConfigMaps in the namespace, only the verbs the example
	// uses, and nothing for leader election (that is in PostgreSQL).
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name {
		t.Errorf("RoleBinding %+v does not bind Role %s to ServiceAccount %s", binding, role.Name, sa.Name)
	}
	if len(role.Rules) != 1 {
		t.Fatalf("Role has %d rules, want 1: %+v", len(role.Rules), role.Rules)
	}
	r := role.Rules[0]
	if strings.Join(r.APIGroups, ",") != "" || strings.Join(r.Resources, ",") != "configmaps" ||
		strings.Join(r.Verbs, ",") != "get,list,watch,update" {
		t.Errorf("Role rule %+v: want configmaps get,list,watch,update in the core group", r)
	}

	// Probes hit the port the manager serves them on, at /healthz and /readyz.
	var probePort int32
	for _, p := range c.Ports {
		if p.Name == "probes" {
			probePort = p.ContainerPort
		}
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.LivenessProbe.HTTPGet.Port.String() != "probes" {
		t.Errorf("liveness probe %+v: want GET /healthz on port probes", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.ReadinessProbe.HTTPGet.Port.String() != "probes" {
		t.Errorf("readiness probe %+v: want GET /readyz on port probes", c.ReadinessProbe)
	}
	args := strings.Join(c.Args, " ")
	if want := "-health-probe-bind-address=:" + strconv.Itoa(int(probePort)); probePort == 0 || !strings.Contains(args, want) {
		t.Errorf("args %q do not serve probes on the probes port %d", args, probePort)
	}

	// Every flag the Deployment passes exists in the manager binary.
	known := managerFlags(t)
	for _, a := range c.Args {
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		if !known[name] {
			t.Errorf("the Deployment passes %q, which examples/manager does not define (it has %v)", a, known)
		}
	}
}

// managerFlags builds examples/manager and reads its flags from -help.
func managerFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "manager")
	build := exec.Command("go", "build", "-o", bin, "../examples/manager")
	build.Env = os.Environ()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/manager: %v\n%s", err, out)
	}
	out, _ := exec.Command(bin, "-help").CombinedOutput() // exits 0 or 2 after printing usage
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-zA-Z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["dsn"] || !flags["id"] {
		t.Fatalf("could not read the manager's flags from -help:\n%s", out)
	}
	return flags
}

// Package config holds the Kubernetes manifests (kustomize, kubebuilder
// layout: default overlay over manager, rbac and the optional prometheus)
// of the controller-runtime manager example; its test builds and checks
// them. test/e2e's TestManifestsServerSideDryRun applies them to a real
// kube-apiserver with server-side dry run.
package config

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
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
		svc     *corev1.Service
		pdb     *policyv1.PodDisruptionBudget
		ns      *corev1.Namespace
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
		case *corev1.Service:
			svc = v
		case *policyv1.PodDisruptionBudget:
			pdb = v
		case *corev1.Namespace:
			ns = v
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	if dep == nil || sa == nil || secret == nil || role == nil || binding == nil || svc == nil || pdb == nil || ns == nil {
		t.Fatalf("missing objects: deployment %v, serviceaccount %v, secret %v, role %v, rolebinding %v, service %v, pdb %v, namespace %v",
			dep != nil, sa != nil, secret != nil, role != nil, binding != nil, svc != nil, pdb != nil, ns != nil)
	}
	for _, meta := range []string{sa.Namespace, secret.Namespace, role.Namespace, binding.Namespace, svc.Namespace, pdb.Namespace} {
		if meta != dep.Namespace || meta != ns.Name {
			t.Errorf("objects in different namespaces: %q vs %q (Namespace %q)", meta, dep.Namespace, ns.Name)
		}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", dep.Spec.Replicas)
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	matches := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Empty() || !s.Matches(podLabels) {
			t.Errorf("%s selector %v does not select the pods (labels %v): %v", what, sel, podLabels, err)
		}
	}
	matches("Deployment", dep.Spec.Selector)
	matches("PodDisruptionBudget", pdb.Spec.Selector)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	pod := dep.Spec.Template.Spec
	keys := map[string]bool{}
	for _, tsc := range pod.TopologySpreadConstraints {
		matches("topology spread "+tsc.TopologyKey, tsc.LabelSelector)
		keys[tsc.TopologyKey] = true
	}
	if !keys["kubernetes.io/hostname"] || !keys["topology.kubernetes.io/zone"] {
		t.Errorf("topology spread over %v, want hostname and zone", keys)
	}
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	args := strings.Join(c.Args, " ")

	// The DSN comes from the Secret, mounted as a file that -dsn-file names:
	// never a literal, an argument or an environment variable.
	for _, e := range c.Env {
		if strings.Contains(e.Name, "DSN") || strings.Contains(e.Value, "postgres") {
			t.Errorf("environment variable %s: the DSN must come from the mounted Secret file", e.Name)
		}
	}
	dsnFile := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "-dsn-file="); ok {
			dsnFile = v
		}
		if strings.HasPrefix(a, "-dsn=") || strings.Contains(a, "postgres") {
			t.Errorf("argument %q carries a DSN", a)
		}
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.Secret != nil && v.Secret.SecretName == secret.Name {
				if _, ok := secret.StringData[filepath.Base(dsnFile)]; ok && filepath.Dir(dsnFile) == vm.MountPath {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		t.Errorf("-dsn-file=%q is not a key of the Secret %s mounted in the container", dsnFile, secret.Name)
	}
	// The DSN template verifies the server: sslmode=verify-full with a CA
	// file that is mounted.
	dsn := secret.StringData["dsn"]
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("DSN template %q: %v", dsn, err)
	}
	if u.Query().Get("sslmode") != "verify-full" {
		t.Errorf("DSN template sslmode %q, want verify-full", u.Query().Get("sslmode"))
	}
	ca := u.Query().Get("sslrootcert")
	caMounted := false
	for _, vm := range c.VolumeMounts {
		if ca != "" && filepath.Dir(ca) == vm.MountPath {
			caMounted = true
		}
	}
	if !caMounted {
		t.Errorf("sslrootcert %q is not in a mounted volume", ca)
	}

	// RBAC: only ConfigMaps in the namespace, only the verbs the example
	// uses, events for the election's, and nothing for leader election
	// itself (that is in PostgreSQL).
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name ||
		binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("RoleBinding %+v does not bind Role %s to ServiceAccount %s", binding, role.Name, sa.Name)
	}
	want := []string{"/configmaps:get,list,watch,update", "/events:create,patch"}
	var got []string
	for _, r := range role.Rules {
		got = append(got, strings.Join(r.APIGroups, ",")+"/"+strings.Join(r.Resources, ",")+":"+strings.Join(r.Verbs, ","))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Role rules %v, want %v", got, want)
	}

	// Probes hit the port the manager serves them on, at /healthz and /readyz.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.LivenessProbe.HTTPGet.Port.String() != "probes" {
		t.Errorf("liveness probe %+v: want GET /healthz on port probes", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.ReadinessProbe.HTTPGet.Port.String() != "probes" {
		t.Errorf("readiness probe %+v: want GET /readyz on port probes", c.ReadinessProbe)
	}
	if want := "-health-probe-bind-address=:" + strconv.Itoa(int(ports["probes"])); ports["probes"] == 0 || !strings.Contains(args, want) {
		t.Errorf("args %q do not serve probes on the probes port %d", args, ports["probes"])
	}
	// Metrics: served on the metrics port, selected by a Service with the
	// monitoring labels a ServiceMonitor (config/prometheus) selects.
	if want := "-metrics-bind-address=:" + strconv.Itoa(int(ports["metrics"])); ports["metrics"] == 0 || !strings.Contains(args, want) {
		t.Errorf("args %q do not serve metrics on the metrics port %d", args, ports["metrics"])
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("metrics Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "metrics" || svc.Spec.Ports[0].Name != "http-metrics" {
		t.Errorf("metrics Service ports %+v: want http-metrics → the container's metrics port", svc.Spec.Ports)
	}
	if svc.Labels["control-plane"] != "controller-manager" || svc.Labels["app.kubernetes.io/component"] != "metrics" {
		t.Errorf("metrics Service labels %v lack the monitoring labels", svc.Labels)
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
	if !flags["dsn-file"] || !flags["id"] {
		t.Fatalf("could not read the manager's flags from -help:\n%s", out)
	}
	return flags
}

// config/prometheus (optional, needs the Prometheus Operator's CRD) selects
// the metrics Service by its monitoring labels and scrapes its port.
func TestServiceMonitor(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), "prometheus")
	if err != nil {
		t.Fatalf("kustomize build prometheus: %v", err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var sm struct {
		Kind string `json:"kind"`
		Spec struct {
			Endpoints []struct {
				Port string `json:"port"`
				Path string `json:"path"`
			} `json:"endpoints"`
			Selector metav1.LabelSelector `json:"selector"`
		} `json:"spec"`
	}
	// The folder also holds the alert rules and the dashboard's ConfigMap
	// (prometheus_test.go checks them): read the ServiceMonitor's document.
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var kind struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			t.Fatal(err)
		}
		if kind.Kind != "ServiceMonitor" {
			continue
		}
		if err := yaml.Unmarshal(doc, &sm); err != nil { // the fields checked below; the CRD validates the rest
			t.Fatal(err)
		}
	}
	var svc *corev1.Service
	for _, o := range build(t) {
		if s, ok := o.(*corev1.Service); ok {
			svc = s
		}
	}
	if sm.Kind != "ServiceMonitor" || svc == nil {
		t.Fatalf("kind %q, service %v", sm.Kind, svc != nil)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service (labels %v)", sm.Spec.Selector, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, Service port %q", sm.Spec.Endpoints, svc.Spec.Ports[0].Name)
	}
}

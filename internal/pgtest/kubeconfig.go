package pgtest

import (
	"os"
	"path/filepath"
	"testing"
)

// UnreachableKubeconfig writes a kubeconfig whose API server
// (https://127.0.0.1:1) nothing listens on into the test's temporary
// directory and returns its path: for runs that must fail, or stop, before
// they reach a Kubernetes API server.
func UnreachableKubeconfig(t testing.TB) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

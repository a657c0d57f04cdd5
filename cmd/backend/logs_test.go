package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// With --log-format json every line the process writes is one JSON object,
// client-go's (klog) included: here the EndpointSlice informer of peer
// discovery logs that its API server refuses to list them (no RBAC; an API
// server that is not there at all client-go retries silently).
func TestJSONLogsIncludeClientGo(t *testing.T) {
	bin := buildBackend(t)
	apiserver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,`+
			`"message":"endpointslices.discovery.k8s.io is forbidden: User \"x\" cannot list resource \"endpointslices\""}`)
	}))
	defer apiserver.Close()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, apiserver.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t)), "--diagnostics-address", "127.0.0.1:0",
		"--session-store", "ring",
		"--peer-listen-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t)),
		"--peer-key", procs.RandomKey(32),
		"--peer-service", "kube-bind/backend-peers",
		"--session-namespace", "kube-bind",
		"--kubeconfig", kubeconfig,
		"--log-format", "json")
	logs := startProcess(t, cmd)

	// client-go's reflector says that it cannot list the EndpointSlices.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs.String(), "EndpointSlice") {
		if time.Now().After(deadline) {
			t.Fatalf("no client-go log line about the EndpointSlices within 60s:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	var clientGo int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		if rec["level"] == nil || rec["msg"] == nil || rec["time"] == nil {
			t.Errorf("JSON line without level, msg or time: %q", line)
		}
		if rec["component"] == "client-go" {
			clientGo++
		}
	}
	if clientGo == 0 {
		t.Errorf("no client-go line among the JSON lines:\n%s", logs.String())
	}
}

package chart_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

const installScript = "hack/install-test-binaries.sh"

func chartDir(t testing.TB) string {
	return filepath.Join(procs.RepoRoot(), "charts", "kube-bind-backend")
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// testBinary finds helm or kubectl where hack/install-test-binaries.sh puts
// them: $KUBE_BIND_TEST_BINARIES, else the script's cache folder (asked with
// --print-dir, which never starts a build). Missing: the test fails naming
// the script, in CI and everywhere else.
func testBinary(t testing.TB, name string) string {
	t.Helper()
	binOnce.Do(func() {
		if dir := os.Getenv(controlplane.BinariesEnv); dir != "" {
			binDir = dir
			return
		}
		root := procs.RepoRoot()
		var stderr bytes.Buffer
		cmd := exec.Command("bash", filepath.Join(root, installScript), "--print-dir")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			binErr = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		binDir = lines[len(lines)-1]
	})
	if binErr != nil {
		t.Fatalf("%s is not available (%v): run %s once (or hack/test.sh) and set %s to the folder it prints",
			name, binErr, installScript, controlplane.BinariesEnv)
	}
	path := filepath.Join(binDir, name)
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("%s not found in %s: run %s once (or hack/test.sh) and set %s to the folder it prints",
			name, binDir, installScript, controlplane.BinariesEnv)
	}
	return path
}

var (
	helmHomeOnce sync.Once
	helmHome     string
)

// helm runs the helm binary with its own config, cache and data folders, so
// tests never read or write the user's helm setup.
func helm(t testing.TB, args ...string) (stdout string, err error) {
	t.Helper()
	bin := testBinary(t, "helm")
	helmHomeOnce.Do(func() {
		d, e := os.MkdirTemp("", "kbb-helm-home-")
		if e != nil {
			panic(e)
		}
		helmHome = d // removed by TestMain
	})
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(helmHome, "config"),
		"HELM_CACHE_HOME="+filepath.Join(helmHome, "cache"),
		"HELM_DATA_HOME="+filepath.Join(helmHome, "data"),
		"HELM_NO_PLUGINS=1",
	)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stderr.String(), out.String())
	}
	return out.String(), nil
}

// requiredValues are the values a provider must set.
func requiredValues() []string {
	return []string{
		"externalURL=https://bind.example.com",
		"oidc.issuerURL=https://login.example.com",
		"oidc.clientID=kube-bind",
		"oidc.clientSecret=s3cr3t",
	}
}

func setArgs(sets []string) []string {
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// render runs helm template with the required values plus sets and returns
// the rendered objects (CRDs included).
func render(t *testing.T, sets ...string) objects {
	t.Helper()
	return renderIn(t, "bind-system", sets...)
}

// renderIn renders the release kbb as if installed in namespace.
func renderIn(t *testing.T, namespace string, sets ...string) objects {
	t.Helper()
	args := append([]string{"template", "kbb", chartDir(t), "--namespace", namespace, "--include-crds"},
		setArgs(append(requiredValues(), sets...))...)
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// renderErr renders and returns the error helm gives.
func renderErr(t *testing.T, args ...string) error {
	t.Helper()
	_, err := helm(t, append([]string{"template", "kbb", chartDir(t), "--namespace", "bind-system"}, args...)...)
	return err
}

func decode(t *testing.T, manifest string) objects {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs objects
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, manifest)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		// Unstructured's own JSON decoding keeps integers as int64.
		if err := u.UnmarshalJSON(raw); err != nil {
			t.Fatalf("rendered object does not decode: %v\n%s", err, raw)
		}
		objs = append(objs, u)
	}
	return objs
}

type objects []*unstructured.Unstructured

func (o objects) find(kind, name string) *unstructured.Unstructured {
	for _, u := range o {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	return nil
}

func (o objects) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	u := o.find(kind, name)
	if u == nil {
		t.Fatalf("no %s %q rendered; have %s", kind, name, o.names())
	}
	return u
}

func (o objects) ofKind(kind string) objects {
	var out objects
	for _, u := range o {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

func (o objects) names() string {
	var s []string
	for _, u := range o {
		s = append(s, u.GetKind()+"/"+u.GetName())
	}
	return strings.Join(s, ", ")
}

// field reads a nested field, failing the test if it is absent.
func field(t *testing.T, u *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s/%s has no field %s", u.GetKind(), u.GetName(), strings.Join(path, "."))
	}
	return v
}

func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("want an object, got %T %v", v, v)
	}
	return m
}

func asSlice(t *testing.T, v any) []any {
	t.Helper()
	s, ok := v.([]any)
	if !ok {
		t.Fatalf("want a list, got %T %v", v, v)
	}
	return s
}

// container returns the backend container of the Deployment.
func container(t *testing.T, objs objects) map[string]any {
	t.Helper()
	d := objs.get(t, "Deployment", "kbb-kube-bind-backend")
	cs := asSlice(t, field(t, d, "spec", "template", "spec", "containers"))
	if len(cs) != 1 {
		t.Fatalf("want one container, got %d", len(cs))
	}
	return asMap(t, cs[0])
}

// flags returns the container's args as flag name -> value.
func flags(t *testing.T, objs objects) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range asSlice(t, container(t, objs)["args"]) {
		s, ok := a.(string)
		if !ok {
			t.Fatalf("arg %v is not a string", a)
		}
		name, value, _ := strings.Cut(s, "=")
		if !strings.HasPrefix(name, "--") {
			t.Fatalf("arg %q is not a --flag=value", s)
		}
		if _, dup := out[name]; dup {
			t.Fatalf("flag %s given twice", name)
		}
		out[name] = value
	}
	return out
}

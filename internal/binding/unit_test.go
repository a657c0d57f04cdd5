package binding

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Namespace names are valid, stable, differ per identity and never contain
// the raw subject, whatever characters it holds; the length prefix keeps
// ("a/b","c") and ("a","b/c") apart.
func TestNamespaceName(t *testing.T) {
	ids := []struct {
		c   Consumer
		cid string
	}{
		{Consumer{Issuer: "https://idp.example.com", Subject: "alice"}, "abc123"},
		{Consumer{Issuer: "https://idp.example.com", Subject: "alice"}, "abc124"},
		{Consumer{Issuer: "https://idp.example.com", Subject: "Alice"}, "abc123"},
		{Consumer{Issuer: "https://idp.example.com/", Subject: "alice"}, "abc123"},
		{Consumer{Issuer: "a/b", Subject: "c"}, "x"},
		{Consumer{Issuer: "a", Subject: "b/c"}, "x"},
		{Consumer{Issuer: "a", Subject: "b"}, "\x00c"},
		{Consumer{Issuer: "a", Subject: "b\x00"}, "c"},
		{Consumer{Issuer: "https://idp", Subject: "ünïcödé ../../ ; DROP TABLE"}, "x"},
	}
	seen := map[string]int{}
	for i, id := range ids {
		name := namespaceName("kube-bind-", id.c, id.cid)
		if again := namespaceName("kube-bind-", id.c, id.cid); again != name {
			t.Fatalf("not stable: %s vs %s", name, again)
		}
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("%q: %v", name, errs)
		}
		if errs := validation.IsValidLabelValue(identityHash(id.c, id.cid)); len(errs) > 0 {
			t.Errorf("label value: %v", errs)
		}
		if len(id.c.Subject) > 3 && strings.Contains(name, strings.ToLower(id.c.Subject)) {
			t.Errorf("%q contains the subject", name)
		}
		if j, dup := seen[name]; dup {
			t.Errorf("identities %d and %d share namespace %s", j, i, name)
		}
		seen[name] = i
	}
	longest := strings.Repeat("a", maxPrefixLength)
	if err := ValidatePrefix(longest); err != nil {
		t.Fatal(err)
	}
	if errs := validation.IsDNS1123Label(namespaceName(longest, ids[0].c, "x")); len(errs) > 0 {
		t.Errorf("longest prefix: %v", errs)
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, ok := range []string{"kube-bind-", "c", "tenant1-"} {
		if err := ValidatePrefix(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", "0a", "Kube", "a_b", "a.b", strings.Repeat("a", maxPrefixLength+1)} {
		if err := ValidatePrefix(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestValidateIdentity(t *testing.T) {
	good := Consumer{Issuer: "https://idp", Subject: "sub"}
	if err := validateIdentity(good, "c1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c   Consumer
		cid string
	}{
		{Consumer{Issuer: "", Subject: "sub"}, "c"},
		{Consumer{Issuer: "https://idp", Subject: ""}, "c"},
		{good, ""},
		{Consumer{Issuer: "https://idp", Subject: "\xff"}, "c"},
		{Consumer{Issuer: "https://idp", Subject: strings.Repeat("s", maxSubjectLength+1)}, "c"},
		{good, strings.Repeat("c", maxClusterIDLength+1)},
	} {
		if err := validateIdentity(tc.c, tc.cid); !errors.Is(err, ErrInvalidIdentity) {
			t.Errorf("%+v %q: got %v", tc.c, tc.cid, err)
		}
	}
}

func TestNotExportedError(t *testing.T) {
	var err error = &NotExportedError{Group: "example.com", Resource: "widgets"}
	if !errors.Is(err, ErrNotExported) {
		t.Fatal("errors.Is(ErrNotExported) is false")
	}
	if !strings.Contains(err.Error(), "widgets") || !strings.Contains(err.Error(), "example.com") {
		t.Fatalf("message does not name the resource: %s", err)
	}
}

func TestParseScope(t *testing.T) {
	for in, want := range map[string]Scope{"Namespaced": ScopeNamespaced, "cluster": ScopeCluster, " CLUSTER ": ScopeCluster} {
		if got, err := ParseScope(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := ParseScope("Global"); err == nil {
		t.Error("Global accepted")
	}
}

// The issued kubeconfig uses the external address, CA and server name when
// set, else the backend's own connection; its context names the namespace.
func TestKubeconfig(t *testing.T) {
	testCA := selfSignedPEM(t)
	rc := &rest.Config{Host: "https://10.0.0.1:443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("internal-ca"), ServerName: "kubernetes"}}

	ep, err := resolveEndpoint(Config{ExternalAddress: "https://api.example.com:6443", ExternalCA: []byte(testCA), ExternalServerName: "api.internal"}, rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ep.kubeconfig("kube-bind-abc", "tok3n")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || ctx.Namespace != "kube-bind-abc" {
		t.Fatalf("current context %q: %+v", cfg.CurrentContext, ctx)
	}
	cl := cfg.Clusters[ctx.Cluster]
	if cl.Server != "https://api.example.com:6443" || string(cl.CertificateAuthorityData) != testCA || cl.TLSServerName != "api.internal" {
		t.Fatalf("cluster %+v", cl)
	}
	if cfg.AuthInfos[ctx.AuthInfo].Token != "tok3n" {
		t.Fatal("token not in kubeconfig")
	}

	ep, err = resolveEndpoint(Config{}, rc)
	if err != nil {
		t.Fatal(err)
	}
	if ep.server != rc.Host || string(ep.caData) != "internal-ca" || ep.serverName != "kubernetes" {
		t.Fatalf("fallback endpoint %+v", ep)
	}
	if _, err := resolveEndpoint(Config{ExternalCA: []byte("not a certificate")}, rc); err == nil {
		t.Fatal("CA bundle without PEM accepted")
	}
}

// RESTConfig follows kubectl's rules: explicit file, context override,
// KUBECONFIG; an unknown context is an error.
func TestRESTConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://one.example.com"}
- name: two
  cluster: {server: "https://two.example.com"}
users:
- name: u
  user: {token: t}
contexts:
- name: one
  context: {cluster: one, user: u}
- name: two
  context: {cluster: two, user: u}
current-context: one
`), 0o600)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cfg, err := RESTConfig(path, "")
	if err != nil || cfg.Host != "https://one.example.com" {
		t.Fatalf("%v %v", cfg, err)
	}
	cfg, err = RESTConfig(path, "two")
	if err != nil || cfg.Host != "https://two.example.com" {
		t.Fatalf("%v %v", cfg, err)
	}
	if _, err := RESTConfig(path, "three"); err == nil {
		t.Fatal("unknown context accepted")
	}
	t.Setenv("KUBECONFIG", path)
	cfg, err = RESTConfig("", "two")
	if err != nil || cfg.Host != "https://two.example.com" {
		t.Fatalf("KUBECONFIG: %v %v", cfg, err)
	}
	t.Setenv("KUBECONFIG", filepath.Join(dir, "none"))
	t.Setenv("HOME", dir)
	if _, err := RESTConfig("", ""); err == nil {
		t.Fatal("no configuration at all accepted")
	}
}

// selfSignedPEM makes a throwaway CA certificate in PEM.
func selfSignedPEM(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

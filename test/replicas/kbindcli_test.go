package replicas

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// The APIs of TestReleasedCLIAcrossReplicas, its own so that it does not
// see the package's other bindings.
var (
	sprocketAPI = exampleapis.API{Group: "sprockets.example.com", Plural: "sprockets", Kind: "Sprocket", Exported: true}
	gizmoAPI    = exampleapis.API{Group: "gizmos.example.com", Plural: "gizmos", Kind: "Gizmo", Exported: true}
)

// TestReleasedCLIAcrossReplicas: the released kubectl-bind v0.8.2
// (kube-bind.io/v1alpha2) against two replicas behind one address, with
// the released konnector v0.8.2 in a consumer cluster. Its token, minted
// by one replica, is honoured by the other, after both restarted and
// after the peer key rotated to [new, old] (the token keys are derived
// from the session keys, which the ring derives from the peer key); a
// token of another deployment is refused. The browser flow's page is
// opened on one replica and Bind pressed on the other.
func TestReleasedCLIAcrossReplicas(t *testing.T) {
	consumer := controlplane.Consumer(t)
	cp := controlplane.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, cp, sprocketAPI, gizmoAPI); err != nil {
		t.Fatalf("preparing the provider cluster: %v", err)
	}

	// The other deployment shares nothing with A and B but the address
	// (the front, pinned to it) and the identity provider.
	otherKey := procs.RandomKey(32)
	c := newCluster(t, clusterOpts{replicas: 2, noStart: true})
	a, b := c.reps[0], c.reps[1]
	other := newReplica(t, "other-deployment", "127.0.0.1")
	other.args = c.replicaArgs(other, []string{other.peerURL}, writeKeyFile(t, otherKey), "info")
	for _, r := range []*replica{a, b, other} {
		r.start(t)
	}
	k := konnector.StartReleased(t, konnector.ReleasedV1alpha2, consumer.AdminKubeconfigPath(), cp.Host())
	for _, r := range []*replica{a, b, other} {
		r.waitReady(t)
	}

	cli := func(t *testing.T, home string, args ...string) *procs.Command {
		t.Helper()
		return konnector.RunCLI(t, konnector.ReleasedV1alpha2, home, args...)
	}
	// templates lists the offers with the token stored in home, through
	// whichever replica the front is pinned to.
	templates := func(t *testing.T, home string) {
		t.Helper()
		cmd := cli(t, home, "templates")
		if code := cmd.Wait(t, time.Minute); code != 0 {
			t.Fatalf("kubectl-bind templates: exit %d\n%s", code, cmd.Stderr.String())
		}
		for _, api := range []exampleapis.API{sprocketAPI, gizmoAPI} {
			if !strings.Contains(cmd.Stdout.String(), api.Name()) {
				t.Fatalf("kubectl-bind templates does not list %s:\n%s", api.Name(), cmd.Stdout.String())
			}
		}
	}

	// Logged in through A.
	home := t.TempDir()
	c.f.pin(a)
	c.f.takeHits()
	chromium.LoginCLI(t, konnector.ReleasedV1alpha2, home, c.ext, alice)
	if h := c.f.takeHits(); h[a.name] == 0 || len(h) != 1 {
		t.Fatalf("the login went to %v, want %s only", h, a.name)
	}
	token := tokenIn(t, home)
	if got, want := cliKeyIDOf(t, token), cliTokenKeyID(t, c.peerKey); !bytes.Equal(got, want) {
		t.Fatalf("the token is signed with key %x, want %x (derived from the peer key)", got, want)
	}

	t.Run("templates and apiservice on B", func(t *testing.T) {
		c.f.pin(b)
		templates(t, home)
		cmd := cli(t, home, "apiservice", "--template-name", sprocketAPI.Name(), "--name", "sprockets",
			"--kubeconfig", consumer.AdminKubeconfigPath(), "--skip-konnector")
		if code := cmd.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind apiservice: exit %d", code)
		}
		if h := c.f.takeHits(); h[b.name] == 0 || len(h) != 1 {
			t.Fatalf("the CLI's calls went to %v, want %s only", h, b.name)
		}
		requestSucceeded(t, c, "sprockets")
		konnector.ExpectBinding(t, consumer.AdminConfig(), "sprockets")
		konnector.SyncsBothWays(t, consumer.AdminConfig(), cp.AdminConfig(), sprocketAPI, "s1", namespacePrefix)
	})

	t.Run("browser flow from A to B", func(t *testing.T) {
		c.f.pin(a)
		cmd := cli(t, home, "--kubeconfig", consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
		line := cmd.Line(t, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
		u := line[strings.Index(line, "http"):]
		if !strings.HasPrefix(u, c.ext) {
			t.Fatalf("the CLI shows %s, not a page of the front %s", u, c.ext)
		}
		br := chromium.OpenBindPage(t, u, c.ext, alice)
		if h := c.f.takeHits(); h[a.name] == 0 || len(h) != 1 {
			t.Fatalf("the page and login went to %v, want %s only", h, a.name)
		}
		c.f.pin(b)
		chromium.PressBind(t, br, gizmoAPI.Name())
		if h := c.f.takeHits(); h[b.name] == 0 || len(h) != 1 {
			t.Fatalf("the Bind went to %v, want %s only", h, b.name)
		}
		if code := cmd.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind: exit %d; browser at %s:\n%s", code, br.URL(), br.Text("body"))
		}
		requestSucceeded(t, c, gizmoAPI.Name())
		konnector.ExpectBinding(t, consumer.AdminConfig(), gizmoAPI.Name())
	})

	t.Run("token survives restarts and key rotation", func(t *testing.T) {
		killAll(t, a, b)
		a.start(t)
		b.start(t)
		a.waitReady(t)
		b.waitReady(t)
		c.f.pin(b)
		templates(t, home)
		for _, r := range []*replica{a, b} {
			if code := templatesStatus(t, r, token); code != http.StatusOK {
				t.Errorf("after the restart, the token on %s: %d, want 200", r.name, code)
			}
		}

		// Both restart at once with [new, old]: no replica is left with
		// only the old key, which would refuse the new ring's
		// certificates (TestRollingRestartRotatesKey rolls one by one).
		newKey := procs.RandomKey(32)
		rotated := writeKeyFile(t, newKey, c.peerKey)
		killAll(t, a, b)
		for _, r := range []*replica{a, b} {
			r.args = replaceFlag(t, r.args, "--peer-key-file", rotated)
			r.start(t)
		}
		a.waitReady(t)
		b.waitReady(t)
		c.f.pin(a)
		templates(t, home)
		for _, r := range []*replica{a, b} {
			if code := templatesStatus(t, r, token); code != http.StatusOK {
				t.Errorf("after the rotation, the old token on %s: %d, want 200", r.name, code)
			}
		}

		// A new login issues under the new key, and the other replica
		// takes it.
		home2 := t.TempDir()
		chromium.LoginCLI(t, konnector.ReleasedV1alpha2, home2, c.ext, alice)
		fresh := tokenIn(t, home2)
		if got, want := cliKeyIDOf(t, fresh), cliTokenKeyID(t, newKey); !bytes.Equal(got, want) {
			t.Errorf("a login after the rotation: the token is signed with key %x, want %x (of the new peer key; the old one's is %x)",
				got, want, cliTokenKeyID(t, c.peerKey))
		}
		c.f.pin(b)
		templates(t, home2)
	})

	t.Run("token of another deployment", func(t *testing.T) {
		// Logged in at the other deployment through the same address: a
		// good token there...
		homeX := t.TempDir()
		c.f.pin(other)
		chromium.LoginCLI(t, konnector.ReleasedV1alpha2, homeX, c.ext, alice)
		foreign := tokenIn(t, homeX)
		if code := templatesStatus(t, other, foreign); code != http.StatusOK {
			t.Fatalf("the other deployment's token there: %d, want 200", code)
		}
		// ...is none on A and B.
		for _, r := range []*replica{a, b} {
			if code := templatesStatus(t, r, foreign); code != http.StatusUnauthorized {
				t.Errorf("the other deployment's token on %s: %d, want 401", r.name, code)
			}
		}
		// The released CLI does not look at the status of /api/templates
		// and /api/bind (kube-bind v0.8.2 cli/pkg/client: it decodes any
		// body), so it exits 0 on a 401; what shows the refusal is that it
		// lists nothing and binds nothing, and that A logged it.
		c.f.pin(a)
		refusals := func() int { return strings.Count(a.logs.String(), `msg="CLI token refused"`) }
		before := refusals()
		cmd := cli(t, homeX, "templates")
		cmd.Wait(t, time.Minute)
		for _, api := range []exampleapis.API{sprocketAPI, gizmoAPI} {
			if strings.Contains(cmd.Stdout.String(), api.Name()) {
				t.Errorf("kubectl-bind templates with the other deployment's token lists %s:\n%s", api.Name(), cmd.Stdout.String())
			}
		}
		if refusals() == before {
			t.Errorf("%s did not log the refusal of the CLI's templates call", a.name)
		}
		before = refusals()
		cmd = cli(t, homeX, "apiservice", "--template-name", sprocketAPI.Name(), "--name", "foreign",
			"--kubeconfig", consumer.AdminKubeconfigPath(), "--skip-konnector")
		cmd.Wait(t, time.Minute)
		if refusals() == before {
			t.Errorf("%s did not log the refusal of the CLI's apiservice calls", a.name)
		}
		_, err := dynamic.NewForConfigOrDie(consumer.AdminConfig()).Resource(konnector.BindingGVR).Get(context.Background(), "foreign", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("the other deployment's token made APIServiceBinding foreign: %v", err)
		}
	})

	if done, err := k.Exited(); done {
		t.Errorf("the konnector exited: %v", err)
	}
}

// tokenRE finds the CLI token in a kube-bind config.
var tokenRE = regexp.MustCompile(`kbt1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+`)

// tokenIn returns the one CLI token in home's kube-bind config.
func tokenIn(t *testing.T, home string) string {
	t.Helper()
	cfg, err := os.ReadFile(konnector.CLIConfigFile(home))
	if err != nil {
		t.Fatal(err)
	}
	all := tokenRE.FindAllString(string(cfg), -1)
	if len(all) != 1 {
		t.Fatalf("%d CLI tokens in the kube-bind config, want 1:\n%s", len(all), cfg)
	}
	return all[0]
}

// cliKeyIDOf returns the key ID of a CLI token: bytes 1 to 4 of its
// payload (internal/oidc/clitoken).
func cliKeyIDOf(t *testing.T, token string) []byte {
	t.Helper()
	payload, _, _ := strings.Cut(strings.TrimPrefix(token, "kbt1."), ".")
	p, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || len(p) < 5 {
		t.Fatalf("the token's payload does not decode: %v", err)
	}
	return p[1:5]
}

// cliTokenKeyID is the ID of the CLI token key derived from a peer key
// (base64): the session key (sessionKeyID), then HKDF with info "kube-bind
// cli token key", the ID 4 bytes of its SHA-256 (docs/v1alpha2.md §2.3).
func cliTokenKeyID(t *testing.T, peerKey string) []byte {
	t.Helper()
	pk, err := base64.StdEncoding.DecodeString(peerKey)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := hkdf.Key(sha256.New, pk, nil, "kube-bind session key", 32)
	if err != nil {
		t.Fatal(err)
	}
	k, err := hkdf.Key(sha256.New, sk, nil, "kube-bind cli token key", 32)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(k)
	return sum[:4]
}

// templatesStatus is the status of GET /api/templates with token on
// replica r directly.
func templatesStatus(t *testing.T, r *replica, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.addr+"/api/templates", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatalf("GET /api/templates on %s: %v", r.name, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// requestSucceeded waits for the APIServiceExportRequest name, in a
// namespace made for a consumer, to be Succeeded on the provider.
func requestSucceeded(t *testing.T, c *cluster, name string) {
	t.Helper()
	reqs := dynamic.NewForConfigOrDie(c.cp.AdminConfig()).Resource(kbresources.APIServiceExportRequestsV1alpha2)
	var seen []string
	defer func() {
		if t.Failed() {
			t.Logf("requests on the provider: %v", seen)
		}
	}()
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "request "+name+" to be Succeeded on the provider", func() (bool, error) {
		list, err := reqs.List(c.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, r := range list.Items {
			phase, _, _ := unstructured.NestedString(r.Object, "status", "phase")
			seen = append(seen, r.GetNamespace()+"/"+r.GetName()+": "+phase)
			if r.GetName() == name && strings.HasPrefix(r.GetNamespace(), namespacePrefix) && phase == "Succeeded" {
				return true, nil
			}
		}
		return false, nil
	})
}

// Package pollbackend starts the backend's real HTTP router
// (internal/httpapi) with the real in-memory session store on a loopback
// port, for tests of poll clients. The store's clock is real time plus an
// offset the test can advance, so poll intervals pass in real time while
// session expiry and grace periods can be jumped over.
package pollbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	apiv1alpha1 "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Options configure Start; zero fields take the defaults named.
type Options struct {
	// Prefix is the external URL's path (default: none).
	Prefix string
	// PollInterval defaults to 200ms, to keep tests quick.
	PollInterval time.Duration
	// SessionTTL defaults to httpapi's 10 minutes.
	SessionTTL time.Duration
	// Limits default to sessions.DefaultLimits (grace 60s).
	Limits sessions.Limits
	// LongPollMaxWait turns long polling on (default: off).
	LongPollMaxWait time.Duration
	// Wrap, if set, wraps the memory store the backend uses (e.g. in a
	// fakes.FlakyStore); Backend.Store stays the memory store underneath.
	Wrap func(sessions.Store) sessions.Store
}

// Backend is a running backend.
type Backend struct {
	// URL is the external URL (scheme, host, prefix); ExportURL is its
	// discovery document.
	URL       string
	ExportURL string
	Store     *memory.Store
	Sessions  *lifecycle.Service
	Clock     *testutil.Clock
	Server    *httptest.Server

	created atomic.Int64
}

// Complete records resp as the outcome of session sid, as a bind in the
// browser does; with no provider cluster, it names no namespace.
func (b *Backend) Complete(sid string, resp []byte) error {
	sess, err := b.Sessions.Open(sid)
	if err != nil {
		return err
	}
	return b.Store.Complete(context.Background(), sid, sess.ExpiresAt, "", resp)
}

// Deny denies session sid with reason, as a cancel in the browser does.
func (b *Backend) Deny(sid, reason string) error {
	sess, err := b.Sessions.Open(sid)
	if err != nil {
		return err
	}
	return b.Sessions.Deny(context.Background(), sess, reason)
}

// SessionsCreated counts the POST /sessions requests the backend answered.
func (b *Backend) SessionsCreated() int { return int(b.created.Load()) }

// Start starts a backend that test t stops at its end.
func Start(t testing.TB, o Options) *Backend {
	t.Helper()
	if o.PollInterval == 0 {
		o.PollInterval = 200 * time.Millisecond
	}
	clock := testutil.RealClock()
	store := memory.New(o.Limits, clock.Now)
	clusterKey, err := clusterkey.New(bytes.Repeat([]byte("c"), clusterkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), sessionkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	var used sessions.Store = store
	if o.Wrap != nil {
		used = o.Wrap(store)
	}
	svc, err := lifecycle.New(lifecycle.Config{Store: used, Keys: keys, ClusterKey: clusterKey,
		SessionTTL: o.SessionTTL, Grace: o.Limits.Grace, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	ext, err := url.Parse("http://" + srv.Listener.Addr().String() + o.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	pollSessions, err := pollsession.New(svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	lp := longpoll.New(longpoll.Options{MaxWait: o.LongPollMaxWait, MaxHeld: longpoll.DefaultMaxHeld})
	v1, err := apiv1alpha1.New(apiv1alpha1.Config{ExternalURL: ext, PrettyName: "Test Provider", PollInterval: o.PollInterval,
		LongPollMaxWait: lp.MaxWait(), Sessions: pollSessions})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Config{
		ExternalURL:  ext,
		PollInterval: o.PollInterval,
		Sessions:     svc,
		Now:          clock.Now,
		LongPoll:     lp,
		Parts:        []mount.Part{v1, browser.Unconfigured{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{URL: ext.String(), ExportURL: ext.String() + apiv1alpha1.PathExport, Store: store, Sessions: svc, Clock: clock, Server: srv}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/sessions") {
			b.created.Add(1)
		}
		h.ServeHTTP(w, r)
	})
	srv.Start()
	t.Cleanup(srv.Close)
	return b
}

// Kubeconfig returns a kubeconfig YAML for server whose current context's
// namespace is namespace, as a provider issues it.
func Kubeconfig(t testing.TB, server, namespace string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["provider"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte("test-ca")}
	cfg.AuthInfos["consumer"] = &clientcmdapi.AuthInfo{Token: "test-service-account-token"}
	cfg.Contexts["provider"] = &clientcmdapi.Context{Cluster: "provider", AuthInfo: "consumer", Namespace: namespace}
	cfg.CurrentContext = "provider"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BindingResponse returns the JSON of a valid BindingResponse for session
// sid, with one APIServiceExportRequest per "resource.group" name, the
// way the browser part stores it with Store.Complete.
func BindingResponse(t testing.TB, sid, namespace string, resources ...string) []byte {
	t.Helper()
	br := v1alpha1.BindingResponse{
		APIVersion: v1alpha1.GroupVersion,
		Kind:       v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{
			OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: sid, ID: "https://issuer.example/alice"},
		},
		Kubeconfig: Kubeconfig(t, "https://provider.example:6443", namespace),
		Requests:   []json.RawMessage{},
	}
	for _, name := range resources {
		resource, group, _ := strings.Cut(name, ".")
		req, err := json.Marshal(v1alpha1.APIServiceExportRequestResponse{
			APIVersion: v1alpha1.GroupVersion,
			Kind:       v1alpha1.KindAPIServiceExportRequest,
			Metadata:   v1alpha1.NameMeta{Name: name},
			Spec: v1alpha1.APIServiceExportRequestResponseSpec{
				Resources: []v1alpha1.APIServiceExportRequestResource{{Group: group, Resource: resource}},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		br.Requests = append(br.Requests, req)
	}
	b, err := json.Marshal(br)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

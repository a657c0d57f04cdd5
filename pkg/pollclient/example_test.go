package pollclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http/httptest"
	"net/url"
	"time"

	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	apiv1alpha1 "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
)

// The whole poll flow against a provider. The provider here is the
// backend's real router with its in-memory store; the user's part in the
// browser is played by completing the session in the store.
func Example() {
	provider := startExampleProvider()
	defer provider.close()
	ctx := context.Background()

	c := pollclient.New(nil)
	p, err := c.Discover(ctx, provider.exportURL)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("provider:", p.PrettyName)

	// Pass the cluster ID of an earlier binding to land in the same
	// provider namespace; "" asks for a new one.
	s, err := c.CreateSession(ctx, p, "")
	if err != nil {
		log.Fatal(err)
	}
	authURL, err := s.AuthenticationURL()
	if err != nil {
		log.Fatal(err)
	}
	_ = authURL // show it to the user: "open this URL in a browser"

	go provider.userBinds(s.ID) // in real life: the user, in the browser

	res, err := s.Wait(ctx, pollclient.WithProgress(func(p pollclient.Progress) {
		// e.g. log p.State and p.Wait
	}))
	if err != nil {
		log.Fatal(err) // errors.Is(err, pollclient.ErrAccessDenied) etc.
	}
	fmt.Println("namespace:", res.Namespace)
	fmt.Println("server:", res.Server)
	for _, raw := range res.Response.Requests {
		var r v1alpha1.APIServiceExportRequestResponse
		if err := json.Unmarshal(raw, &r); err != nil {
			log.Fatal(err)
		}
		fmt.Println("request:", r.Metadata.Name)
	}
	// res.Response.Kubeconfig is the kubeconfig to store for the konnector.

	// Output:
	// provider: Example Provider
	// namespace: kube-bind-example
	// server: https://provider.example:6443
	// request: mangodbs.mangodb.com
}

type exampleProvider struct {
	exportURL string
	store     *memory.Store
	sessions  *lifecycle.Service
	srv       *httptest.Server
}

func startExampleProvider() *exampleProvider {
	store := memory.New(sessions.DefaultLimits, nil)
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), sessionkey.MinKeyLen))
	if err != nil {
		log.Fatal(err)
	}
	clusterKey, err := clusterkey.New(bytes.Repeat([]byte("c"), clusterkey.MinKeyLen))
	if err != nil {
		log.Fatal(err)
	}
	svc, err := lifecycle.New(lifecycle.Config{Store: store, Keys: keys, ClusterKey: clusterKey})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	ext, _ := url.Parse("http://" + srv.Listener.Addr().String())
	pollSessions, err := pollsession.New(svc, nil)
	if err != nil {
		log.Fatal(err)
	}
	v1, err := apiv1alpha1.New(apiv1alpha1.Config{ExternalURL: ext, PrettyName: "Example Provider", PollInterval: 100 * time.Millisecond, Sessions: pollSessions})
	if err != nil {
		log.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Config{ExternalURL: ext, PollInterval: 100 * time.Millisecond, Sessions: svc,
		Parts: []mount.Part{v1, browser.Unconfigured{}}})
	if err != nil {
		log.Fatal(err)
	}
	srv.Config.Handler = h
	srv.Start()
	return &exampleProvider{exportURL: ext.String() + "/export", store: store, sessions: svc, srv: srv}
}

func (e *exampleProvider) close() {
	e.srv.Close()
}

// userBinds does what the browser part does when the user has picked the
// APIs: it completes the session with the BindingResponse.
func (e *exampleProvider) userBinds(sid string) {
	time.Sleep(300 * time.Millisecond) // a few polls are still pending
	kubeconfig := []byte(`apiVersion: v1
kind: Config
clusters:
- name: provider
  cluster: {server: "https://provider.example:6443"}
users:
- name: consumer
  user: {token: example-token}
contexts:
- name: provider
  context: {cluster: provider, user: consumer, namespace: kube-bind-example}
current-context: provider
`)
	req, _ := json.Marshal(v1alpha1.APIServiceExportRequestResponse{
		APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindAPIServiceExportRequest,
		Metadata: v1alpha1.NameMeta{Name: "mangodbs.mangodb.com"},
		Spec: v1alpha1.APIServiceExportRequestResponseSpec{Resources: []v1alpha1.APIServiceExportRequestResource{
			{Group: "mangodb.com", Resource: "mangodbs"}}},
	})
	resp, _ := json.Marshal(v1alpha1.BindingResponse{
		APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: sid, ID: "https://issuer.example/alice"}},
		Kubeconfig:     kubeconfig,
		Requests:       []json.RawMessage{req},
	})
	sess, err := e.sessions.Open(sid)
	if err != nil {
		log.Fatal(err)
	}
	if err := e.store.Complete(context.Background(), sid, sess.ExpiresAt, "", resp); err != nil {
		log.Fatal(err)
	}
}

// Package fakes holds the tests' one stand-in for each part the HTTP
// handlers and the session lifecycle call out to: the login at the
// identity provider, the catalog, the offers and the provisioner. Tests
// that need the real parts use them (internal/localenv); these are for
// the in-process tests of the handlers' own rules.
package fakes

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/oidc"
)

// Issuer is the identity provider of Login: its identities' issuer and
// the host its login links go to.
const Issuer = "https://idp.example.com"

// Login is an identity provider whose callback query says how the login
// there went: state (single use, as oidc.Authenticator's), user (who
// logged in; User when absent) and error (the provider's refusal, e.g.
// access_denied). The zero value is ready to use.
type Login struct {
	// User logs in when the callback names nobody.
	User string
	// Refused are the users outside the allow-list: their login ends in
	// oidc.ErrAccessDenied.
	Refused []string
	// Err, when set, is how every login with a known state ends.
	Err error
	// Panic makes Begin panic (a bug in the login, for the router's
	// recovery).
	Panic atomic.Bool

	mu      sync.Mutex
	begun   int
	pending map[string][]byte // state → flow state, until its callback
	fresh   []started         // since the last Take
}

type started struct{ state, flow string }

// Begin sends the browser to Issuer with a new state that stands for
// flowState.
func (l *Login) Begin(_ http.ResponseWriter, _ *http.Request, flowState []byte) (string, error) {
	if l.Panic.Load() {
		panic("fakes.Login told to panic")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		l.pending = map[string][]byte{}
	}
	l.begun++
	state := "state" + strconv.Itoa(l.begun)
	l.pending[state] = bytes.Clone(flowState)
	l.fresh = append(l.fresh, started{state, string(flowState)})
	return Issuer + "/auth?state=" + state, nil
}

// Finish ends the login its callback's state began.
func (l *Login) Finish(_ http.ResponseWriter, r *http.Request) (oidc.Identity, []byte, error) {
	q := r.URL.Query()
	l.mu.Lock()
	flow, ok := l.pending[q.Get("state")]
	delete(l.pending, q.Get("state"))
	l.mu.Unlock()
	user := q.Get("user")
	if user == "" {
		user = l.User
	}
	switch {
	case !ok:
		return oidc.Identity{}, nil, oidc.ErrInvalidState
	case q.Get("error") != "":
		return oidc.Identity{}, flow, &oidc.ProviderError{Code: q.Get("error")}
	case l.Err != nil:
		return oidc.Identity{}, flow, l.Err
	case slices.Contains(l.Refused, user):
		return oidc.Identity{}, flow, fmt.Errorf("%w: %s is not in the allow-list", oidc.ErrAccessDenied, user)
	}
	return oidc.Identity{Issuer: Issuer, Subject: user, Email: user + "@example.com"}, flow, nil
}

// Begun counts the logins begun.
func (l *Login) Begun() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.begun
}

// Pending counts the logins begun and not finished.
func (l *Login) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// Take returns the flow states of the logins begun since the last Take,
// in order, and forgets them: their callbacks then fail as unknown, so a
// long fuzzing run holds nothing.
func (l *Login) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, b := range l.fresh {
		out = append(out, b.flow)
		delete(l.pending, b.state)
	}
	l.fresh = nil
	return out
}

// Catalog is a catalog of the APIs in it.
type Catalog []binding.ExportedAPI

// List returns the APIs.
func (c Catalog) List() []binding.ExportedAPI { return c }

// Lookup returns the API of group and resource.
func (c Catalog) Lookup(group, resource string) (binding.ExportedAPI, bool) {
	i := slices.IndexFunc(c, func(a binding.ExportedAPI) bool { return a.Group == group && a.Resource == resource })
	if i < 0 {
		return binding.ExportedAPI{}, false
	}
	return c[i], true
}

// MangoDBs is the API the tests' catalogs export.
var MangoDBs = binding.ExportedAPI{Name: "mangodbs.mangodb.com", Group: "mangodb.com", Resource: "mangodbs",
	Kind: "MangoDB", Scope: "Namespaced", Versions: []string{"v1"}}

// Offers are offers and the collections that show them.
type Offers struct {
	Items []offers.Offer
	Shown []offers.Collection
}

// List returns the offers.
func (o Offers) List() []offers.Offer { return o.Items }

// Get returns the offer named name.
func (o Offers) Get(name string) (offers.Offer, bool) {
	i := slices.IndexFunc(o.Items, func(x offers.Offer) bool { return x.Name == name })
	if i < 0 {
		return offers.Offer{}, false
	}
	return o.Items[i], true
}

// Collections returns the collections.
func (o Offers) Collections() []offers.Collection { return o.Shown }

// ProvisionCall is what a Provisioner was asked.
type ProvisionCall struct {
	Consumer  binding.Consumer
	ClusterID string
	Resources []binding.Resource
}

// ProvisionedNamespace is the consumer's namespace in Provisioner's
// results.
const ProvisionedNamespace = "kb-ns"

// Provisioner records what it is asked and answers with a result naming
// the consumer, in ProvisionedNamespace, with each resource asked for
// exported in version v1. The zero value is ready to use.
type Provisioner struct {
	// Err, when set, fails every Provision (which is still recorded).
	Err error
	// MarkErr, when set, fails every MarkDelivered (not recorded).
	MarkErr error
	// Bound maps resources ("<resource>.<group>") to the request the
	// consumer's namespace binds them by: a Provision of one of them
	// under another request fails with *binding.AlreadyBoundError, as
	// the real one does for a returning consumer.
	Bound map[string]string

	mu        sync.Mutex
	calls     []ProvisionCall
	next      error
	marked    []string
	requested []string
}

// MarkDelivered records ns as marked delivered, or fails with MarkErr.
func (p *Provisioner) MarkDelivered(_ context.Context, ns string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.MarkErr != nil {
		return p.MarkErr
	}
	p.marked = append(p.marked, ns)
	return nil
}

// RequestAPIs records the APIs requested in ns.
func (p *Provisioner) RequestAPIs(_ context.Context, ns string, apis []binding.ExportedAPI) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range apis {
		p.requested = append(p.requested, ns+"/"+a.Name)
	}
	return nil
}

// Requested returns what RequestAPIs recorded, "<ns>/<API name>", in
// order.
func (p *Provisioner) Requested() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requested)
}

// Marked returns the namespaces MarkDelivered recorded, in order.
func (p *Provisioner) Marked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.marked)
}

// FailNext makes the next Provision fail with err.
func (p *Provisioner) FailNext(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = err
}

// Provision records the call and answers it.
func (p *Provisioner) Provision(_ context.Context, c binding.Consumer, clusterID string, rs []binding.Resource) (*binding.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, ProvisionCall{c, clusterID, slices.Clone(rs)})
	if err := p.next; err != nil {
		p.next = nil
		return nil, err
	}
	if p.Err != nil {
		return nil, p.Err
	}
	for _, r := range rs {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		if by, ok := p.Bound[gr.String()]; ok && by != r.RequestName() {
			return nil, &binding.AlreadyBoundError{Resource: gr, By: by, Request: r.RequestName()}
		}
	}
	res := &binding.Result{Namespace: ProvisionedNamespace, Kubeconfig: []byte("apiVersion: v1\nkind: Config\n"), ConsumerID: c.ID()}
	for _, r := range rs {
		res.APIs = append(res.APIs, binding.ExportedAPI{Name: r.Resource + "." + r.Group, Group: r.Group, Resource: r.Resource, Versions: []string{"v1"}})
	}
	return res, nil
}

// Existing says no binding exists yet.
func (p *Provisioner) Existing(context.Context, binding.Consumer, string) (time.Time, bool, error) {
	return time.Time{}, false, nil
}

// Take returns the calls since the last Take.
func (p *Provisioner) Take() []ProvisionCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.calls
	p.calls = nil
	return c
}

package v1alpha2

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/url"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kbprovider/backend/pkg/protocol"
)

// Bounds of what the released CLI sends.
const (
	// maxRedirectURL bounds redirect_url (http://127.0.0.1:65535/callback
	// has 31 characters).
	maxRedirectURL = 64
	// maxSessionID bounds session_id (the CLI sends 26 characters).
	maxSessionID = 128
	// maxClusterIdentity bounds a cluster identity (a UID has 36).
	maxClusterIdentity = 128
	// MaxBindBody bounds the body of POST /api/bind (the CLI sends about
	// 250 bytes).
	MaxBindBody = 16 << 10
)

// ParseRedirectURL accepts the callback of the released CLI's localhost
// listener and nothing else: http, host 127.0.0.1, localhost or [::1], a
// port 1–65535 in digits, path /callback, no user, query or fragment, in
// its canonical spelling (what it parses to prints as the same string).
// Anything else would let a link send a credential to an address its
// author chose.
func ParseRedirectURL(raw string) (*url.URL, bool) {
	if raw == "" || len(raw) > maxRedirectURL {
		return nil, false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.User != nil || u.Opaque != "" || u.RawQuery != "" || u.ForceQuery ||
		u.Fragment != "" || u.RawFragment != "" || u.Path != "/callback" || u.RawPath != "" {
		return nil, false
	}
	switch u.Hostname() {
	case "127.0.0.1", "localhost", "::1":
	default:
		return nil, false
	}
	if _, ok := protocol.Port(u.Port()); !ok || u.String() != raw {
		return nil, false
	}
	return u, true
}

// ValidSessionID: 1–128 characters of [A-Za-z0-9_-] (the CLI's own
// session ID, echoed back to it).
func ValidSessionID(s string) bool { return protocol.URLSafe(s, maxSessionID) }

// ValidClusterIdentity: 1–128 characters of [A-Za-z0-9._:-] (the CLI
// sends the UID of kube-system).
func ValidClusterIdentity(s string) bool {
	if len(s) == 0 || len(s) > maxClusterIdentity {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// LoginRequest is a checked GET /api/authorize (kubectl bind login).
type LoginRequest struct {
	RedirectURL string
	SessionID   string
}

// BrowserRequest is a checked GET / of plain `kubectl bind`.
type BrowserRequest struct {
	RedirectURL string
	SessionID   string
	// ConsumerID is the consumer cluster's identity (the UID of its
	// kube-system namespace): unproven, like c in the v1alpha1 callback
	// flow, since the result goes to this browser's own machine.
	ConsumerID string
}

// ParseLoginQuery checks the query of GET /api/authorize: redirect_url
// and session_id once each and valid, client_type absent or "cli", and
// cluster_id absent or empty (this backend serves one provider cluster).
// The error is a sentence for the user.
func ParseLoginQuery(rawQuery string) (LoginRequest, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return LoginRequest{}, errors.New("the query does not parse")
	}
	redirect, sid, err := common(q)
	if err != nil {
		return LoginRequest{}, err
	}
	if ct, present, ok := optional(q, "client_type"); !ok || (present && ct != "cli") {
		return LoginRequest{}, errors.New(`client_type must be "cli", once, or absent`)
	}
	return LoginRequest{RedirectURL: redirect, SessionID: sid}, nil
}

// ParseBrowserQuery checks the query of GET / from plain `kubectl bind`:
// as ParseLoginQuery, plus consumer_id once, a valid cluster identity.
func ParseBrowserQuery(rawQuery string) (BrowserRequest, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return BrowserRequest{}, errors.New("the query does not parse")
	}
	redirect, sid, err := common(q)
	if err != nil {
		return BrowserRequest{}, err
	}
	consumer, ok := protocol.Single(q, "consumer_id")
	if !ok || !ValidClusterIdentity(consumer) {
		return BrowserRequest{}, errors.New("consumer_id must be the cluster's identity (1 to 128 of A-Z a-z 0-9 . _ : -), once")
	}
	return BrowserRequest{RedirectURL: redirect, SessionID: sid, ConsumerID: consumer}, nil
}

func common(q url.Values) (redirect, sid string, err error) {
	raw, ok := protocol.Single(q, "redirect_url")
	if !ok {
		return "", "", errors.New("redirect_url must be given once")
	}
	if _, ok := ParseRedirectURL(raw); !ok {
		return "", "", errors.New("redirect_url must be http://127.0.0.1:<port>/callback (or localhost, or [::1]) on this computer")
	}
	sid, ok = protocol.Single(q, "session_id")
	if !ok || !ValidSessionID(sid) {
		return "", "", errors.New("session_id must be 1 to 128 of A-Z a-z 0-9 _ -, once")
	}
	if cid, present, ok := optional(q, "cluster_id"); !ok || (present && cid != "") {
		return "", "", errors.New("cluster_id names a provider cluster; this provider has one, so it must be empty or absent")
	}
	return raw, sid, nil
}

// optional returns the value of key if present (ok false when repeated).
func optional(q url.Values, key string) (v string, present, ok bool) {
	vs, present := q[key]
	if !present {
		return "", false, true
	}
	if len(vs) != 1 {
		return "", true, false
	}
	return vs[0], true, true
}

// BindRequest is a checked body of POST /api/bind.
type BindRequest struct {
	// Name names the request in the response (metadata.name).
	Name string
	// Template is the offer to bind (spec.templateRef.name).
	Template string
	// ClusterIdentity identifies the consumer cluster (unproven).
	ClusterIdentity string
}

// bindWire is the BindableResourcesRequest as the released CLI marshals
// it (a Kubernetes object: full metadata, a status); nothing else is
// accepted.
type bindWire struct {
	APIVersion string            `json:"apiVersion,omitempty"`
	Kind       string            `json:"kind,omitempty"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		TemplateRef struct {
			Name string `json:"name"`
		} `json:"templateRef"`
		ClusterIdentity struct {
			Identity   string `json:"identity"`
			PrettyName string `json:"prettyName,omitempty"`
		} `json:"clusterIdentity"`
		Author              string          `json:"author,omitempty"`
		KubeconfigSecretRef json.RawMessage `json:"kubeconfigSecretRef,omitempty"`
		TTLAfterFinished    json.RawMessage `json:"ttlAfterFinished,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// ParseBindRequest reads the body of POST /api/bind strictly: one JSON
// object of the BindableResourcesRequest's fields (no unknown field, no
// trailing data), apiVersion and kind absent or kube-bind.io/v1alpha2
// BindableResourcesRequest, metadata.name a DNS subdomain, a template
// name, and a valid cluster identity. The error is a sentence for the
// client.
func ParseBindRequest(body []byte) (BindRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w bindWire
	if err := dec.Decode(&w); err != nil {
		return BindRequest{}, errors.New("the body is not a BindableResourcesRequest")
	}
	if _, err := dec.Token(); err != io.EOF {
		return BindRequest{}, errors.New("the body has data after the request")
	}
	if (w.APIVersion != "" && w.APIVersion != "kube-bind.io/v1alpha2") || (w.Kind != "" && w.Kind != "BindableResourcesRequest") {
		return BindRequest{}, errors.New("apiVersion and kind must be kube-bind.io/v1alpha2 BindableResourcesRequest, or absent")
	}
	name := w.Metadata.Name
	if name == "" || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return BindRequest{}, errors.New("metadata.name must be a DNS subdomain name (the APIServiceExportRequest's)")
	}
	tmpl := w.Spec.TemplateRef.Name
	if tmpl == "" || len(validation.IsDNS1123Subdomain(tmpl)) > 0 {
		return BindRequest{}, errors.New("spec.templateRef.name must name a template")
	}
	if !ValidClusterIdentity(w.Spec.ClusterIdentity.Identity) {
		return BindRequest{}, errors.New("spec.clusterIdentity.identity must be 1 to 128 of A-Z a-z 0-9 . _ : -")
	}
	if protocol.IssuedClusterID(w.Spec.ClusterIdentity.Identity) {
		return BindRequest{}, errors.New("spec.clusterIdentity.identity has the form of a cluster ID this provider issues to poll clients; " +
			"such a cluster binds through the poll flow, which proves it, or by signing in, never with a CLI token alone")
	}
	return BindRequest{Name: name, Template: tmpl, ClusterIdentity: w.Spec.ClusterIdentity.Identity}, nil
}

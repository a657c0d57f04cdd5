// Package v1alpha1 holds the wire types of the kube-bind v1alpha1 binding
// protocol as this backend speaks it: discovery (BindingProvider), the poll
// session, the BindingResponse and error bodies. The JSON names follow the
// released kube-bind clients exactly; see docs/protocol.md.
package v1alpha1

import (
	"encoding/json"
	"time"
)

const (
	// ProviderAPIVersion is the bare apiVersion of a BindingProvider; released
	// CLIs compare it literally.
	ProviderAPIVersion = "v1alpha1"
	// GroupVersion is the apiVersion of every other object of the protocol.
	GroupVersion = "kube-bind.io/v1alpha1"

	KindBindingProvider         = "BindingProvider"
	KindPollSession             = "Oauth2CodeGrantPollSession"
	KindBindingResponse         = "BindingResponse"
	KindAPIServiceExportRequest = "APIServiceExportRequest"

	MethodOAuth2CodeGrant     = "OAuth2CodeGrant"
	MethodOAuth2CodeGrantPoll = "OAuth2CodeGrantPoll"
)

// BindingProvider is the discovery document served at the export URL.
type BindingProvider struct {
	APIVersion            string                 `json:"apiVersion"`
	Kind                  string                 `json:"kind"`
	ProviderPrettyName    string                 `json:"providerPrettyName"`
	Version               string                 `json:"version"`
	AuthenticationMethods []AuthenticationMethod `json:"authenticationMethods"`
}

// AuthenticationMethod is one way to authenticate; exactly one of the
// method-specific fields is set, matching Method.
type AuthenticationMethod struct {
	Method              string               `json:"method"`
	OAuth2CodeGrant     *OAuth2CodeGrant     `json:"oauth2CodeGrant,omitempty"`
	OAuth2CodeGrantPoll *OAuth2CodeGrantPoll `json:"oauth2CodeGrantPoll,omitempty"`
}

// OAuth2CodeGrant is the callback flow of released kube-bind CLIs.
type OAuth2CodeGrant struct {
	AuthenticatedURL string `json:"authenticatedURL"`
}

// OAuth2CodeGrantPoll is the poll flow.
type OAuth2CodeGrantPoll struct {
	SessionURL       string `json:"sessionURL"`
	AuthenticatedURL string `json:"authenticatedURL"`
	PollURL          string `json:"pollURL"`
	// PollInterval is a Go duration string, e.g. "2s".
	PollInterval string `json:"pollInterval"`
	// LongPollMaxWait, when set, says the provider holds a poll that asks
	// with "Prefer: wait=N" for up to this long (a Go duration string,
	// e.g. "30s") and answers as soon as the session ends. An extension of
	// this backend (docs/long-polling.md); released clients ignore it.
	LongPollMaxWait string `json:"longPollMaxWait,omitempty"`
}

// CreateSessionRequest is the optional body of POST <sessionURL>.
type CreateSessionRequest struct {
	ClusterID string `json:"clusterID,omitempty"`
}

// PollSession is the 201 answer to POST <sessionURL>.
type PollSession struct {
	APIVersion    string    `json:"apiVersion"`
	Kind          string    `json:"kind"`
	SessionID     string    `json:"sessionID"`
	ClusterID     string    `json:"clusterID"`
	SessionSecret string    `json:"sessionSecret"`
	ExpiresAt     time.Time `json:"expiresAt"`
	// ClusterSecret comes with a newly issued cluster ID only. The client
	// keeps it with the cluster ID and proves it holds it on later sessions
	// that present that ID (package pkg/protocol); released clients ignore it.
	ClusterSecret string `json:"clusterSecret,omitempty"`
}

// BindingResponse is what a consumer receives at the end of either flow.
type BindingResponse struct {
	APIVersion     string                `json:"apiVersion"`
	Kind           string                `json:"kind"`
	Authentication BindingAuthentication `json:"authentication"`
	// Kubeconfig is the kubeconfig YAML; JSON carries it as base64.
	Kubeconfig []byte `json:"kubeconfig"`
	// Requests are APIServiceExportRequest objects, kept raw so that a
	// client passes them on unchanged.
	Requests []json.RawMessage `json:"requests"`
}

// BindingAuthentication says how the consumer was authenticated.
type BindingAuthentication struct {
	OAuth2CodeGrant *CodeGrantAuthentication `json:"oauth2CodeGrant,omitempty"`
}

// CodeGrantAuthentication names the session and the consumer identity.
type CodeGrantAuthentication struct {
	// SessionID is the session the response belongs to (JSON "sid").
	SessionID string `json:"sid"`
	// ID is the consumer identity, "<issuer>/<subject>".
	ID string `json:"id"`
}

// APIServiceExportRequestResponse is one entry of BindingResponse.Requests.
type APIServiceExportRequestResponse struct {
	APIVersion string                              `json:"apiVersion"`
	Kind       string                              `json:"kind"`
	Metadata   NameMeta                            `json:"metadata"`
	Spec       APIServiceExportRequestResponseSpec `json:"spec"`
}

// NameMeta is the part of ObjectMeta that a request response carries.
type NameMeta struct {
	Name string `json:"name"`
}

// APIServiceExportRequestResponseSpec lists the resources of one request.
type APIServiceExportRequestResponseSpec struct {
	Resources  []APIServiceExportRequestResource `json:"resources"`
	Parameters json.RawMessage                   `json:"parameters,omitempty"`
}

// APIServiceExportRequestResource names one group/resource to bind.
type APIServiceExportRequestResource struct {
	Group    string   `json:"group"`
	Resource string   `json:"resource"`
	Versions []string `json:"versions,omitempty"`
}

// Error is the body of every JSON error answer.
type Error struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// Error codes of the poll protocol (docs/protocol.md §3 and §6).
const (
	ErrorAuthorizationPending = "authorization_pending"
	ErrorSlowDown             = "slow_down"
	ErrorAccessDenied         = "access_denied"
	ErrorInvalidSignature     = "invalid_signature"
	ErrorExpiredToken         = "expired_token"
	ErrorInvalidRequest       = "invalid_request"
	// Not in the poll table, used by other endpoints.
	ErrorRequestTooLarge        = "request_too_large"
	ErrorTemporarilyUnavailable = "temporarily_unavailable"
)

// Package lifecycle owns the life of a binding session, whichever HTTP
// route drives it: it issues sessions (POST /sessions for the poll flow,
// GET /authorize for the callback flow), checks the requests made with
// them, admits polls, provisions the consumer on bind, records the
// outcome and hands it to the polls. The handlers in internal/httpapi and
// internal/httpapi/browser only parse requests, call it and render.
//
// A pending session is not stored anywhere: its ID and secret are derived
// with sessionkey, so any replica checks it, after any restart. What is
// stored (sessions.Store) is what happens to it: the outcome, its first
// delivery, the single-use marks of its links, and the pace of its polls.
package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Provisioner sets a consumer up on the provider cluster and records
// there that its response was handed out (implemented by
// *binding.Provisioner).
type Provisioner interface {
	Provision(ctx context.Context, c binding.Consumer, clusterID string, resources []binding.Resource) (*binding.Result, error)
	// MarkDelivered records that the response of provider namespace ns
	// is handed out, unless that is recorded already
	// (binding.AnnotationDeliveredAt, which the garbage collection reads).
	MarkDelivered(ctx context.Context, ns string) error
}

// Offers are what a v1alpha2 consumer may pick (implemented by the offers
// source over the catalog, templates and collections).
type Offers interface {
	Get(name string) (offers.Offer, bool)
}

// Catalog says which APIs a consumer may bind (implemented by
// *binding.Catalog).
type Catalog interface {
	Lookup(group, resource string) (binding.ExportedAPI, bool)
}

// Config configures a Service.
type Config struct {
	// Store keeps outcomes, marks and poll pace. Required.
	Store sessions.Store
	// Keys derive session IDs and secrets. Required.
	Keys *sessionkey.Keys
	// ClusterKey issues cluster IDs and their secrets. Required.
	ClusterKey *clusterkey.Key
	// SessionTTL is how long a session lives (default sessions.DefaultTTL).
	SessionTTL time.Duration
	// Grace is how long a delivered response is served again (default
	// sessions.DefaultLimits.Grace); the store must keep records as long.
	Grace time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Catalog and Provisioner are needed for Select and Bind only.
	// Without a Provisioner nothing is bound, so no delivery is marked.
	Catalog     Catalog
	Provisioner Provisioner
	// Offers are needed for SelectOffers only.
	Offers Offers
	// RenderV1alpha2 renders the BindingResponse of the v1alpha2 flows
	// (internal/httpapi/v1alpha2.Render); without it, they bind nothing.
	RenderV1alpha2 Renderer
}

// Result is a bind's outcome as a protocol generation renders it into
// its BindingResponse.
type Result struct {
	binding.Result
	// SessionID is the response's authentication.oauth2CodeGrant.sid.
	SessionID string
	// Picks are the offers a v1alpha2 consumer picked, one request each
	// (nil for v1alpha1, whose requests are the resolved APIs).
	Picks []Pick
}

// Pick is one picked offer and the name of its request in the response.
type Pick struct {
	// Name names the request ("" means the offer's name).
	Name  string
	Offer offers.Offer
}

// RequestName is the name of the pick's request.
func (p Pick) RequestName() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Offer.Name
}

// Renderer renders a Result as the JSON BindingResponse of a generation.
type Renderer func(Result) ([]byte, error)

// RenderV1alpha1 renders the kube-bind.io/v1alpha1 BindingResponse: one
// request per resolved API, named <resource>.<group>.
func RenderV1alpha1(r Result) ([]byte, error) {
	resp := v1alpha1.BindingResponse{
		APIVersion: v1alpha1.GroupVersion,
		Kind:       v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{
			OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: r.SessionID, ID: r.ConsumerID},
		},
		Kubeconfig: r.Kubeconfig,
	}
	for _, api := range r.APIs {
		raw, err := json.Marshal(v1alpha1.APIServiceExportRequestResponse{
			APIVersion: v1alpha1.GroupVersion,
			Kind:       v1alpha1.KindAPIServiceExportRequest,
			Metadata:   v1alpha1.NameMeta{Name: api.Resource + "." + api.Group},
			Spec: v1alpha1.APIServiceExportRequestResponseSpec{
				Resources: []v1alpha1.APIServiceExportRequestResource{{
					Group: api.Group, Resource: api.Resource, Versions: api.Versions,
				}},
			},
		})
		if err != nil {
			return nil, err
		}
		resp.Requests = append(resp.Requests, raw)
	}
	return json.Marshal(resp)
}

// Service runs the session lifecycle.
type Service struct{ cfg Config }

// New checks cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Keys == nil || cfg.ClusterKey == nil {
		return nil, errors.New("lifecycle: Store, Keys and ClusterKey are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = sessions.DefaultTTL
	}
	if cfg.Grace <= 0 {
		cfg.Grace = sessions.DefaultLimits.Grace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg}, nil
}

// SessionTTL is the life of the sessions the service creates.
func (s *Service) SessionTTL() time.Duration { return s.cfg.SessionTTL }

// Session is a session as its ID says, with the callback-flow fields its
// login carries along.
type Session struct {
	sessionkey.Session
	// CallbackURL and CallbackSessionID are set for sessions of the
	// callback flow of released CLIs: where to redirect the browser, and
	// the CLI's own session ID to echo back.
	CallbackURL       string
	CallbackSessionID string
	// Ended: opened by OpenPoll after ExpiresAt, within the grace period;
	// only a response delivered before ExpiresAt is still served.
	Ended bool
}

// CreatePollSession issues a session of the poll flow (protocol §3). It
// returns the cluster ID the session will bind with unless its link
// proves the presented one, and the cluster secret of a new cluster ID
// ("" when the client presented one: that one's secret is the client's).
func (s *Service) CreatePollSession(presentedClusterID string) (sess Session, clusterID, clusterSecret string) {
	return s.CreatePollSessionOf(sessionkey.FlowPoll, presentedClusterID)
}

// CreatePollSessionOf is CreatePollSession for a poll flow of either
// generation (FlowPoll or FlowPollV1alpha2).
func (s *Service) CreatePollSessionOf(flow sessionkey.Flow, presentedClusterID string) (sess Session, clusterID, clusterSecret string) {
	if !flow.Polled() {
		panic("lifecycle: CreatePollSessionOf with a flow that is not polled")
	}
	sess.Session = s.cfg.Keys.Issue(flow, presentedClusterID, s.cfg.Now().Add(s.cfg.SessionTTL))
	if sess.ClusterID != "" {
		return sess, sess.ClusterID, ""
	}
	clusterID = clusterkey.NewClusterID(sess.ID)
	return sess, clusterID, s.cfg.ClusterKey.Secret(clusterID)
}

// CreateCallbackSession issues the session of a callback-flow login: the
// released CLI's session ID and the checked callback URL the response
// goes to travel with the login, not in any store.
func (s *Service) CreateCallbackSession(callbackURL, cliSessionID string) Session {
	return s.CreateRedirectSession(sessionkey.FlowCallback, callbackURL, cliSessionID)
}

// CreateRedirectSession issues the session of a login whose result goes
// to a CLI's localhost callback: the v1alpha1 callback flow
// (FlowCallback), the browser flow of plain `kubectl bind`
// (FlowBrowserV1alpha2) or `kubectl bind login` (FlowCLILogin).
func (s *Service) CreateRedirectSession(flow sessionkey.Flow, callbackURL, cliSessionID string) Session {
	if flow.Polled() || !flow.Valid() {
		panic("lifecycle: CreateRedirectSession with a polled flow")
	}
	return Session{
		Session:     s.cfg.Keys.Issue(flow, "", s.cfg.Now().Add(s.cfg.SessionTTL)),
		CallbackURL: callbackURL, CallbackSessionID: cliSessionID,
	}
}

var (
	// ErrUnknownSession: the ID is not one this backend issued.
	ErrUnknownSession = errors.New("not a session of this backend")
	// ErrExpired: the session ended (expired, or its key was retired).
	ErrExpired = errors.New("the session expired")
)

// Open checks a session ID: ErrUnknownSession, ErrExpired, or the session.
func (s *Service) Open(id string) (Session, error) { return s.open(id, 0) }

// OpenPoll is Open for a poll: a session that expired less than the
// grace period ago is still opened (Ended), so that a response first
// delivered just before the expiry gets its whole grace period.
func (s *Service) OpenPoll(id string) (Session, error) { return s.open(id, s.cfg.Grace) }

// open opens a session until its expiry plus grace.
func (s *Service) open(id string, grace time.Duration) (Session, error) {
	ks, err := s.cfg.Keys.Open(id)
	now := s.cfg.Now()
	switch {
	case errors.Is(err, sessionkey.ErrUnknownKey):
		return Session{}, ErrExpired
	case err != nil:
		return Session{}, ErrUnknownSession
	case !now.Before(ks.ExpiresAt.Add(grace)):
		return Session{}, ErrExpired
	}
	return Session{Session: ks, Ended: !now.Before(ks.ExpiresAt)}, nil
}

// UseLink spends the nonce of an authorize link once a user signed in
// through it: sessions.ErrNonceUsed if somebody signed in through the
// link before, on any replica.
func (s *Service) UseLink(ctx context.Context, sess Session, nonce string) error {
	return s.cfg.Store.UseOnce(ctx, "link\n"+sess.ID+"\n"+nonce, sess.ExpiresAt)
}

// UseLoginState spends a login state (oidc.Config.UseOnce, called once
// the user signed in), kept for a session's life.
func (s *Service) UseLoginState(ctx context.Context, key string) error {
	return s.cfg.Store.UseOnce(ctx, "login-state\n"+key, s.cfg.Now().Add(s.cfg.SessionTTL))
}

// Outcome is what the session ended with so far (the zero Outcome while
// pending).
func (s *Service) Outcome(ctx context.Context, sess Session) (sessions.Outcome, error) {
	return s.cfg.Store.Outcome(ctx, sess.ID)
}

// AdmitPoll admits a poll of sess with nonce (sessions.Store.AdmitPoll).
func (s *Service) AdmitPoll(ctx context.Context, sess Session, nonce string, minInterval time.Duration) error {
	return s.cfg.Store.AdmitPoll(ctx, sess.ID, nonce, sess.ExpiresAt.Add(s.cfg.Grace), minInterval)
}

// Wait holds until sess has an outcome or ctx ends (long polls).
func (s *Service) Wait(ctx context.Context, sess Session) (sessions.Outcome, error) {
	return s.cfg.Store.Wait(ctx, sess.ID)
}

var (
	// ErrDelivered: the response was delivered longer than the grace
	// period ago; it is never served again.
	ErrDelivered = errors.New("the response was delivered and its grace period is over")
	// ErrBindingGone: the binding the response was issued for is not on
	// the provider cluster any more (unbound or revoked meanwhile), or
	// the outcome does not say which it is; its credential is worth
	// nothing, so it is not handed out.
	ErrBindingGone = errors.New("the binding of the response is gone from the provider cluster")
)

// Deliver returns nil when completed outcome o of sess may be handed to a
// poll now: its binding, in the provider namespace the outcome records
// (o.Namespace), is marked delivered on the provider cluster (see
// delivered), and the poll is within the grace period after the first
// delivery (which this call records if it is the first), and that was
// before the session expired. Else ErrDelivered, ErrBindingGone, or an
// error of the store or the provider cluster (errors.Is
// sessions.ErrUnavailable when it is worth trying again).
//
// The mark comes before the first delivery's record: the grace period
// starts only once the binding is safe from the garbage collection, so a
// failed mark costs the poll nothing but a retry, and a crash between the
// two leaves a binding marked but not yet handed out, which the garbage
// collection spares (the safe way to be wrong). A session that ended is
// served only if its first delivery came before the end, so its mark is
// checked after the record: a late poll of a response never handed out
// must not mark it.
func (s *Service) Deliver(ctx context.Context, sess Session, o sessions.Outcome) error {
	if !sess.Ended {
		if err := s.delivered(ctx, o.Namespace); err != nil {
			return err
		}
	}
	first, err := s.cfg.Store.Deliver(ctx, sess.ID, sess.ExpiresAt)
	if err != nil {
		return err
	}
	if !first.Before(sess.ExpiresAt) || s.cfg.Now().After(first.Add(s.cfg.Grace)) {
		return ErrDelivered
	}
	if sess.Ended {
		return s.delivered(ctx, o.Namespace)
	}
	return nil
}

// delivered is the event "the response of provider namespace ns is about
// to be handed out": it returns once the binding is marked delivered on
// the provider cluster (binding.AnnotationDeliveredAt), which the garbage
// collection of unused bindings reads. Every path that hands a response
// out calls it first, and hands nothing out when it fails.
func (s *Service) delivered(ctx context.Context, ns string) error {
	if s.cfg.Provisioner == nil {
		return nil
	}
	if ns == "" {
		return fmt.Errorf("%w: the outcome names no provider namespace", ErrBindingGone)
	}
	switch err := s.cfg.Provisioner.MarkDelivered(ctx, ns); {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", ErrBindingGone, err)
	default:
		// The API server down, slow, or refusing: transient for the
		// client, who tries again.
		return fmt.Errorf("%w: recording the delivery: %w", sessions.ErrUnavailable, err)
	}
}

// SelectionError says what is wrong with the APIs a user picked, in words
// for the user.
type SelectionError struct{ Problem string }

func (e *SelectionError) Error() string { return e.Problem }

// Select turns the picked API IDs (<resource>.<group>) into resources,
// dropping repeats and keeping the order. Nothing may be provisioned
// unless every one is exported: else a *SelectionError.
func (s *Service) Select(picked []string) ([]binding.Resource, []string, error) {
	if s.cfg.Catalog == nil || s.cfg.Provisioner == nil {
		return nil, nil, ErrNoProvider
	}
	if len(picked) == 0 {
		return nil, nil, &SelectionError{"Pick at least one API."}
	}
	seen := map[string]bool{}
	var resources []binding.Resource
	var names []string
	for _, name := range picked {
		if seen[name] {
			continue
		}
		seen[name] = true
		resource, group, _ := strings.Cut(name, ".")
		if _, ok := s.cfg.Catalog.Lookup(group, resource); !ok {
			return nil, nil, notOffered(name)
		}
		resources = append(resources, binding.Resource{Group: group, Resource: resource})
		names = append(names, name)
	}
	return resources, names, nil
}

func notOffered(name string) *SelectionError {
	return &SelectionError{"The API " + name + " is not offered by this provider. Pick from the list."}
}

// SelectOffers turns the picked offer names into picks, dropping repeats
// and keeping the order: a *SelectionError unless every one is offered.
func (s *Service) SelectOffers(picked []string) ([]Pick, error) {
	if s.cfg.Offers == nil || s.cfg.Provisioner == nil || s.cfg.RenderV1alpha2 == nil {
		return nil, ErrNoProvider
	}
	if len(picked) == 0 {
		return nil, &SelectionError{"Pick at least one API."}
	}
	seen := map[string]bool{}
	// Each pick becomes an export request, and a consumer namespace binds
	// a resource through one request only: two picks of one resource
	// (a template and the CRD's implicit offer, say) would end with one
	// of them refused and the bind half made.
	boundBy := map[schema.GroupResource]string{}
	var picks []Pick
	for _, name := range picked {
		if seen[name] {
			continue
		}
		seen[name] = true
		o, ok := s.cfg.Offers.Get(name)
		if !ok {
			return nil, notOffered(name)
		}
		for _, r := range o.Resources {
			gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
			if other, taken := boundBy[gr]; taken && other != name {
				return nil, &SelectionError{fmt.Sprintf("%s and %s both bind %s: pick only one of them.", other, name, gr)}
			}
			boundBy[gr] = name
		}
		picks = append(picks, Pick{Offer: o})
	}
	return picks, nil
}

// Offer returns the offer name (v1alpha2 consumers), or false.
func (s *Service) Offer(name string) (offers.Offer, bool) {
	if s.cfg.Offers == nil {
		return offers.Offer{}, false
	}
	return s.cfg.Offers.Get(name)
}

// Errors of Bind besides *SelectionError and the store's.
var (
	// ErrAlreadyDone: the session was completed or denied before (a
	// second submit of the same form).
	ErrAlreadyDone = errors.New("the session is not pending any more")
	// ErrProvisioning: the provider cluster could not set the consumer
	// up (the cause is wrapped; nothing the user did).
	ErrProvisioning = errors.New("provisioning failed")
	// ErrNoProvider: the service was built without a catalog and a
	// provisioner, so it binds nothing.
	ErrNoProvider = errors.New("lifecycle: no catalog and provisioner configured")
)

// RefusedError is a bind the provider refuses for the user's own state
// (binding.ErrClusterCap, binding.ErrClusterNotProven): a 4xx, with
// Reason in words for the user. A poll session is denied with it.
type RefusedError struct {
	Reason string
	Err    error
}

func (e *RefusedError) Error() string { return e.Reason }
func (e *RefusedError) Unwrap() error { return e.Err }

// Bind provisions consumer with resources under clusterID, renders the
// v1alpha1 response for sess's flow (the CLI's session ID in the callback
// flow) and records it as the session's outcome, with the provider
// namespace Deliver marks. A response that goes to a CLI's callback
// instead is handed out by the caller at once, so Bind marks its delivery
// first (see delivered). It returns the BindingResponse. Provisioning is idempotent, so a bind that two
// replicas run at once (the form sent twice) provisions the same objects
// and records one outcome.
func (s *Service) Bind(ctx context.Context, sess Session, consumer binding.Consumer, clusterID string, resources []binding.Resource) ([]byte, error) {
	return s.bind(ctx, sess, consumer, clusterID, resources, nil)
}

// BindOffers is Bind for the v1alpha2 flows (sessions of FlowPollV1alpha2
// and FlowBrowserV1alpha2): it provisions every resource of the picked
// offers and renders one request per pick.
func (s *Service) BindOffers(ctx context.Context, sess Session, consumer binding.Consumer, clusterID string, picks []Pick) ([]byte, error) {
	if len(picks) == 0 {
		return nil, &SelectionError{"Pick at least one API."}
	}
	return s.bind(ctx, sess, consumer, clusterID, pickedResources(picks), picks)
}

// BindDirect binds one pick with no session (POST /api/bind with a CLI
// token): it provisions, renders the v1alpha2 response, with sid as its
// session ID, and marks its delivery (see delivered), which the caller
// makes at once; the session store records nothing.
func (s *Service) BindDirect(ctx context.Context, consumer binding.Consumer, clusterID, sid string, pick Pick) ([]byte, error) {
	consumer.Proof = binding.ProofToken
	body, res, err := s.provision(ctx, consumer, clusterID, sid, pickedResources([]Pick{pick}), []Pick{pick})
	if err != nil {
		return nil, err
	}
	if err := s.delivered(ctx, res.Namespace); err != nil {
		return nil, err
	}
	return body, nil
}

func pickedResources(picks []Pick) []binding.Resource {
	var resources []binding.Resource
	for _, p := range picks {
		for _, r := range p.Offer.Resources {
			resources = append(resources, binding.Resource{Group: r.Group, Resource: r.Resource})
		}
	}
	return resources
}

func (s *Service) bind(ctx context.Context, sess Session, consumer binding.Consumer, clusterID string, resources []binding.Resource, picks []Pick) ([]byte, error) {
	sid := sess.ID
	if sess.CallbackURL != "" {
		sid = sess.CallbackSessionID
	}
	if sess.Flow.V1alpha2() != (picks != nil) {
		return nil, fmt.Errorf("lifecycle: a %s session bound with the other generation's selection", generation(sess.Flow))
	}
	// A poll session's cluster ID was issued by this backend and settled
	// with its proof (SettleCluster); the other flows' is the word of a
	// user who just signed in.
	consumer.Proof = binding.ProofLogin
	if sess.Flow.Polled() {
		consumer.Proof = binding.ProofIssued
	}
	body, res, err := s.provision(ctx, consumer, clusterID, sid, resources, picks)
	var refused *RefusedError
	if errors.As(err, &refused) {
		// The client polls until it hears why.
		if derr := s.Deny(ctx, sess, refused.Reason); derr != nil {
			return nil, derr
		}
	}
	if err != nil {
		return nil, err
	}
	if !sess.Flow.Polled() {
		// Its response goes to the CLI's callback at once, never to a
		// poll: nothing to record in the store, but the delivery.
		if err := s.delivered(ctx, res.Namespace); err != nil {
			return nil, err
		}
		return body, nil
	}
	if err := s.Complete(ctx, sess, res.Namespace, body); err != nil {
		return nil, err
	}
	return body, nil
}

// Complete records response, issued for provider namespace ns, as the
// outcome of poll session sess (Bind does, once it provisioned):
// ErrAlreadyDone if it has one.
func (s *Service) Complete(ctx context.Context, sess Session, ns string, response []byte) error {
	switch err := s.cfg.Store.Complete(ctx, sess.ID, sess.ExpiresAt, ns, response); {
	case errors.Is(err, sessions.ErrNotPending):
		return ErrAlreadyDone
	default:
		return err
	}
}

func generation(f sessionkey.Flow) string {
	if f.V1alpha2() {
		return "v1alpha2"
	}
	return "v1alpha1"
}

// provision provisions and renders: v1alpha1 without picks, v1alpha2
// with them.
func (s *Service) provision(ctx context.Context, consumer binding.Consumer, clusterID, sid string, resources []binding.Resource, picks []Pick) ([]byte, *binding.Result, error) {
	if s.cfg.Provisioner == nil {
		return nil, nil, ErrNoProvider
	}
	render := RenderV1alpha1
	if picks != nil {
		if s.cfg.RenderV1alpha2 == nil {
			return nil, nil, ErrNoProvider
		}
		render = s.cfg.RenderV1alpha2
	}
	res, err := s.cfg.Provisioner.Provision(ctx, consumer, clusterID, resources)
	var ne *binding.NotExportedError
	if errors.As(err, &ne) {
		// The catalog changed since Select.
		return nil, nil, notOffered(ne.Resource + "." + ne.Group)
	}
	if errors.Is(err, binding.ErrClusterCap) {
		return nil, nil, &RefusedError{Reason: err.Error(), Err: err}
	}
	if errors.Is(err, binding.ErrClusterNotProven) {
		return nil, nil, &RefusedError{Err: err, Reason: "this cluster was bound with the poll flow, which proves its cluster ID; " +
			"bind it again that way or by signing in (a CLI token alone never reaches its binding)"}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrProvisioning, err)
	}
	body, err := render(Result{Result: *res, SessionID: sid, Picks: picks})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the binding response: %w", err)
	}
	return body, res, nil
}

// Deny ends a pending poll session with reason, which its poll reports. A
// session that is not pending any more is left as it is (nil), and a
// callback-flow session has nobody polling to tell.
func (s *Service) Deny(ctx context.Context, sess Session, reason string) error {
	if !sess.Flow.Polled() {
		return nil
	}
	if err := s.cfg.Store.Deny(ctx, sess.ID, sess.ExpiresAt, reason); err != nil && !errors.Is(err, sessions.ErrNotPending) {
		return err
	}
	return nil
}

// SettleCluster returns the cluster ID a poll session binds with: the one
// issued to it when it presented none; the presented one when proof
// proves its cluster secret for this session (proven); else a new one.
func (s *Service) SettleCluster(sess Session, proof string) (clusterID string, proven bool) {
	if sess.ClusterID != "" && s.cfg.ClusterKey.Proven(sess.ID, sess.ClusterID, proof) {
		return sess.ClusterID, true
	}
	return clusterkey.NewClusterID(sess.ID), false
}

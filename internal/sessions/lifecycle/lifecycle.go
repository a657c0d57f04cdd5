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
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// Provisioner sets a consumer up on the provider cluster and records
// there that its response was handed out (implemented by
// *binding.Provisioner).
type Provisioner interface {
	Provision(ctx context.Context, c binding.Consumer, clusterID string, resources []binding.Resource) (*binding.Result, error)
	// Existing says whether the identity is bound already, and since when.
	Existing(ctx context.Context, c binding.Consumer, clusterID string) (created time.Time, exists bool, err error)
	// MarkDelivered records that the response of provider namespace ns
	// is handed out, unless that is recorded already
	// (binding.AnnotationDeliveredAt, which the garbage collection reads).
	MarkDelivered(ctx context.Context, ns string) error
	// RequestAPIs makes the export requests of apis in ns, for a
	// generation whose konnector makes none (Generation.RequestsAPIs).
	RequestAPIs(ctx context.Context, ns string, apis []binding.ExportedAPI) error
}

// Offers are what a consumer of a generation that picks offers may pick
// (implemented by the offers source over the catalog, templates and
// collections).
type Offers interface {
	List() []offers.Offer
	Get(name string) (offers.Offer, bool)
	Collections() []offers.Collection
}

// Catalog says which APIs a consumer may bind (implemented by
// *binding.Catalog).
type Catalog interface {
	List() []binding.ExportedAPI
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
	// Provisioner binds; without it nothing is bound, so no delivery is
	// marked. Catalog and Offers are what the consumers pick from: the
	// exported APIs, and the offers (Generation.PicksOffers).
	Catalog     Catalog
	Provisioner Provisioner
	Offers      Offers
}

// Result is a bind's outcome as a protocol generation renders it into
// its BindingResponse.
type Result struct {
	binding.Result
	// SessionID is the response's authentication.oauth2CodeGrant.sid.
	SessionID string
	// Picks are the offers the consumer picked (a generation that picks
	// APIs renders the resolved APIs instead).
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

// Generation is a protocol generation as the session service binds it.
// Each generation's package registers its own (Register).
type Generation struct {
	// Name is the generation of the session flows it binds
	// (GenerationOf).
	Name string
	// Render renders a bind's result as the generation's BindingResponse.
	Render Renderer
	// PicksOffers: a pick names an offer (Config.Offers). Else it names
	// an API of the catalog (<resource>.<group>), and picks that API's
	// implicit offer.
	PicksOffers bool
	// NamespacedOnly: a cluster-scoped API is refused at the selection
	// (kbind v2 keeps names, which consumers of a cluster-scoped API
	// would share).
	NamespacedOnly bool
	// RequestsAPIs: the bind makes the export requests of the picked
	// APIs itself (Provisioner.RequestAPIs), since the generation's
	// konnector makes none; the consumer's rights on them come from
	// those requests, as for every generation.
	RequestsAPIs bool
}

// Names of the generations the session flows belong to.
const (
	V1alpha1 = "v1alpha1"
	V1alpha2 = "v1alpha2"
	// V2 is kbind v2 (core.kbind.io): its outcome is the one-apply
	// bundle (docs/v2.md).
	V2 = "v2"
)

// GenerationOf names the generation of a session flow.
func GenerationOf(f sessionkey.Flow) string {
	if f == sessionkey.FlowBrowserV2 {
		return V2
	}
	if f.V1alpha2() {
		return V1alpha2
	}
	return V1alpha1
}

var (
	generationsMu sync.RWMutex
	generations   = map[string]Generation{}
)

// Register makes g's sessions bindable; its package calls it once, from
// init. A second registration of a name replaces the first.
func Register(g Generation) {
	if g.Name == "" || g.Render == nil {
		panic("lifecycle: Register needs a name and a renderer")
	}
	generationsMu.Lock()
	defer generationsMu.Unlock()
	generations[g.Name] = g
}

func generation(name string) (Generation, bool) {
	generationsMu.RLock()
	defer generationsMu.RUnlock()
	g, ok := generations[name]
	return g, ok
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

// SessionRequest says which session CreateSession issues.
type SessionRequest struct {
	Flow sessionkey.Flow
	// ClusterID is the one a client of a polled flow presented: the
	// session binds with it only if its link proves it (SettleCluster).
	ClusterID string
	// CallbackURL (checked) and CallbackSessionID (the CLI's own session
	// ID) of a flow whose result goes to a CLI's localhost callback: they
	// travel with the login, not in any store.
	CallbackURL, CallbackSessionID string
}

// CreateSession issues a session. For a polled flow (protocol §3) it
// returns the cluster ID the session will bind with unless its link
// proves the presented one, and the cluster secret of a new cluster ID
// ("" when the client presented one: that one's secret is the client's);
// for kbind v2's browser flow a new cluster ID and no secret (nobody
// proves it later: a pickup binds a new cluster each time); for the
// others, two empty strings.
func (s *Service) CreateSession(req SessionRequest) (sess Session, clusterID, clusterSecret string) {
	if !req.Flow.Valid() || req.Flow.Recorded() != (req.CallbackURL == "") {
		panic("lifecycle: CreateSession of a recorded flow with a callback, or of a redirect flow without one")
	}
	if !req.Flow.Polled() {
		req.ClusterID = ""
	}
	sess = Session{
		Session:     s.cfg.Keys.Issue(req.Flow, req.ClusterID, s.cfg.Now().Add(s.cfg.SessionTTL)),
		CallbackURL: req.CallbackURL, CallbackSessionID: req.CallbackSessionID,
	}
	if req.Flow == sessionkey.FlowBrowserV2 {
		// A new cluster, whose namespace nobody has bound before.
		return sess, clusterkey.NewClusterID(sess.ID), ""
	}
	if !req.Flow.Polled() {
		return sess, "", ""
	}
	if sess.ClusterID != "" {
		return sess, sess.ClusterID, ""
	}
	clusterID = clusterkey.NewClusterID(sess.ID)
	return sess, clusterID, s.cfg.ClusterKey.Secret(clusterID)
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

// LoginStates is the oidc.Config.UseOnce of the browser login: a login
// state is spent (once the user signed in) as a single-use mark in the
// session store, kept for a session's life (ttl), so it is single-use
// across replicas and restarts. It needs the store only: the login is
// built before the session service.
func LoginStates(store sessions.Store, ttl time.Duration, now func() time.Time) func(ctx context.Context, flowState []byte, key string) error {
	if now == nil {
		now = time.Now
	}
	if ttl <= 0 {
		ttl = sessions.DefaultTTL
	}
	return func(ctx context.Context, _ []byte, key string) error {
		return store.UseOnce(ctx, "login-state\n"+key, now().Add(ttl))
	}
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
// for the user; Err is the cause, when there is one beyond the words
// (*binding.AlreadyBoundError).
type SelectionError struct {
	Problem string
	Err     error
}

func (e *SelectionError) Error() string { return e.Problem }
func (e *SelectionError) Unwrap() error { return e.Err }

// Select turns the names a user of sess's generation picked into picks,
// dropping repeats and keeping the order: a *SelectionError unless every
// one is offered and no two of them hold one resource (overlapping). An
// API of the catalog is picked as its implicit offer.
func (s *Service) Select(sess Session, picked []string) ([]Pick, error) {
	gen, ok := s.binds(sess.Flow)
	if !ok {
		return nil, ErrNoProvider
	}
	if len(picked) == 0 {
		return nil, &SelectionError{Problem: "Pick at least one API."}
	}
	seen := map[string]bool{}
	var picks []Pick
	for _, name := range picked {
		if seen[name] {
			continue
		}
		seen[name] = true
		o, problem := s.pickable(gen, name)
		if problem != nil {
			return nil, problem
		}
		picks = append(picks, Pick{Offer: o})
	}
	if err := overlapping(picks); err != nil {
		return nil, err
	}
	return picks, nil
}

// overlapping refuses picks of which two hold one resource: each pick
// becomes an export request, and a consumer namespace binds a resource
// through one request only, so the second would be refused and the bind
// left half made (offers.FirstOverlap).
func overlapping(picks []Pick) error {
	chosen := make([]offers.Offer, len(picks))
	for i, p := range picks {
		chosen[i] = p.Offer
	}
	o, ok := offers.FirstOverlap(chosen)
	if !ok {
		return nil
	}
	return &SelectionError{Problem: fmt.Sprintf("%s and %s both bind %s: pick only one of them.", o.First, o.Second, o.Resource)}
}

// alreadyBound is the problem of a pick whose resource the consumer's
// cluster binds through another request already.
func alreadyBound(e *binding.AlreadyBoundError) *SelectionError {
	return &SelectionError{Err: e, Problem: fmt.Sprintf("%s is already bound in this cluster by %s, not %s: pick %s to bind it again, or unbind it first.",
		e.Resource, e.By, e.Request, e.By)}
}

// pickable resolves a picked name the way gen's consumers name what they
// bind.
func (s *Service) pickable(gen Generation, name string) (offers.Offer, *SelectionError) {
	if gen.PicksOffers {
		o, ok := s.cfg.Offers.Get(name)
		if !ok {
			return o, notOffered(name)
		}
		return o, nil
	}
	resource, group, _ := strings.Cut(name, ".")
	api, ok := s.cfg.Catalog.Lookup(group, resource)
	if !ok {
		return offers.Offer{}, notOffered(name)
	}
	if gen.NamespacedOnly && api.Scope != apiextensionsv1.NamespaceScoped {
		return offers.Offer{}, &SelectionError{Problem: "The API " + name + " is cluster-scoped: this kind of binding takes namespaced APIs only."}
	}
	return offers.Implicit(api), nil
}

func notOffered(name string) *SelectionError {
	return &SelectionError{Problem: "The API " + name + " is not offered by this provider. Pick from the list."}
}

// binds returns the generation of flow when the service can bind its
// sessions: the generation is registered, and a provisioner and what its
// consumers pick from are configured.
func (s *Service) binds(flow sessionkey.Flow) (Generation, bool) {
	gen, ok := generation(GenerationOf(flow))
	if !ok || s.cfg.Provisioner == nil {
		return Generation{}, false
	}
	if gen.PicksOffers {
		return gen, s.cfg.Offers != nil
	}
	return gen, s.cfg.Catalog != nil
}

// CanBind says whether sessions of flow can be bound here.
func (s *Service) CanBind(flow sessionkey.Flow) bool {
	_, ok := s.binds(flow)
	return ok
}

// ExportedAPIs are the catalog's APIs (none without a catalog).
func (s *Service) ExportedAPIs() []binding.ExportedAPI {
	if s.cfg.Catalog == nil {
		return nil
	}
	return s.cfg.Catalog.List()
}

// Offers are every offer (none without offers).
func (s *Service) Offers() []offers.Offer {
	if s.cfg.Offers == nil {
		return nil
	}
	return s.cfg.Offers.List()
}

// Offer returns the offer name, or false.
func (s *Service) Offer(name string) (offers.Offer, bool) {
	if s.cfg.Offers == nil {
		return offers.Offer{}, false
	}
	return s.cfg.Offers.Get(name)
}

// Collections are the provider's collections of offers.
func (s *Service) Collections() []offers.Collection {
	if s.cfg.Offers == nil {
		return nil
	}
	return s.cfg.Offers.Collections()
}

// Existing says whether the consumer is bound already under clusterID,
// and since when.
func (s *Service) Existing(ctx context.Context, c binding.Consumer, clusterID string) (time.Time, bool, error) {
	if s.cfg.Provisioner == nil {
		return time.Time{}, false, ErrNoProvider
	}
	return s.cfg.Provisioner.Existing(ctx, c, clusterID)
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
	ErrNoProvider = errors.New("lifecycle: no provisioner, or nothing to pick from, for this generation")
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

// Bind provisions consumer with the resources of picks under clusterID,
// renders the response of sess's generation (with the CLI's session ID
// in the flows that end at its callback) and records it as the session's
// outcome, with the provider namespace Deliver marks. A response that
// goes to a CLI's callback instead is handed out by the caller at once,
// so Bind marks its delivery first (see delivered). It returns the
// BindingResponse. Provisioning is idempotent, so a bind that two
// replicas run at once (the form sent twice) provisions the same objects
// and records one outcome.
func (s *Service) Bind(ctx context.Context, sess Session, consumer binding.Consumer, clusterID string, picks []Pick) ([]byte, error) {
	gen, ok := s.binds(sess.Flow)
	if !ok {
		return nil, ErrNoProvider
	}
	if len(picks) == 0 {
		return nil, &SelectionError{Problem: "Pick at least one API."}
	}
	// Picks may come from elsewhere than Select: nothing overlapping is
	// provisioned, whoever made them.
	if err := overlapping(picks); err != nil {
		return nil, err
	}
	sid := sess.ID
	if sess.CallbackURL != "" {
		sid = sess.CallbackSessionID
	}
	if !gen.PicksOffers {
		for _, p := range picks {
			if !p.Offer.Implicit {
				// Its response would name the APIs alone, not the
				// offer's claims and namespaces.
				return nil, fmt.Errorf("lifecycle: a %s session bound with the offer %s, which is not an API's own", gen.Name, p.Offer.Name)
			}
		}
	}
	// A poll session's cluster ID was issued by this backend and settled
	// with its proof (SettleCluster); the other flows' is the word of a
	// user who just signed in.
	consumer.Proof = binding.ProofLogin
	if sess.Flow.Polled() {
		consumer.Proof = binding.ProofIssued
	}
	body, res, err := s.provision(ctx, gen, consumer, clusterID, sid, picks)
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
	if !sess.Flow.Recorded() {
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

// BindDirect binds one pick with no session (a CLI token's bind, of
// generation gen): it provisions, renders the response, with sid as its
// session ID, and marks its delivery (see delivered), which the caller
// makes at once; the session store records nothing.
func (s *Service) BindDirect(ctx context.Context, gen string, consumer binding.Consumer, clusterID, sid string, pick Pick) ([]byte, error) {
	g, ok := generation(gen)
	if !ok || s.cfg.Provisioner == nil {
		return nil, ErrNoProvider
	}
	consumer.Proof = binding.ProofToken
	body, res, err := s.provision(ctx, g, consumer, clusterID, sid, []Pick{pick})
	if err != nil {
		return nil, err
	}
	if err := s.delivered(ctx, res.Namespace); err != nil {
		return nil, err
	}
	return body, nil
}

// pickedResources are the resources of picks, each with the request its
// pick becomes: a consumer bound already may bind a resource again only
// through the request it is bound by (binding.AlreadyBoundError).
func pickedResources(picks []Pick) []binding.Resource {
	var resources []binding.Resource
	for _, p := range picks {
		for _, r := range p.Offer.Resources {
			resources = append(resources, binding.Resource{Group: r.Group, Resource: r.Resource, Request: p.RequestName()})
		}
	}
	return resources
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

// provision provisions the picks' resources and renders gen's response.
func (s *Service) provision(ctx context.Context, gen Generation, consumer binding.Consumer, clusterID, sid string, picks []Pick) ([]byte, *binding.Result, error) {
	res, err := s.cfg.Provisioner.Provision(ctx, consumer, clusterID, pickedResources(picks))
	var ne *binding.NotExportedError
	if errors.As(err, &ne) {
		// The catalog changed since Select.
		return nil, nil, notOffered(ne.Resource + "." + ne.Group)
	}
	var bound *binding.AlreadyBoundError
	if errors.As(err, &bound) {
		// Its request would be refused after the bind: the user picks
		// again, or unbinds first.
		return nil, nil, alreadyBound(bound)
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
	if gen.RequestsAPIs {
		if err := s.cfg.Provisioner.RequestAPIs(ctx, res.Namespace, res.APIs); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrProvisioning, err)
		}
	}
	body, err := gen.Render(Result{Result: *res, SessionID: sid, Picks: picks})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the binding response: %w", err)
	}
	return body, res, nil
}

// Deny ends a pending poll session with reason, which its poll reports. A
// session that is not pending any more is left as it is (nil), and a
// callback-flow session has nobody polling to tell.
func (s *Service) Deny(ctx context.Context, sess Session, reason string) error {
	if !sess.Flow.Recorded() {
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

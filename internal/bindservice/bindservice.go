// Package bindservice owns the life of a binding session, whichever HTTP
// route drives it: it creates sessions (POST /sessions for the poll flow,
// GET /authorize for the callback flow), provisions the consumer on bind,
// fills the BindingResponse and completes the session with it, or denies
// the session. The handlers in internal/httpapi and
// internal/httpapi/browser only parse requests, call it and render.
package bindservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/clusterkey"
	"github.com/kbprovider/backend/internal/ids"
	"github.com/kbprovider/backend/internal/sessions"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Provisioner sets a consumer up on the provider cluster (implemented by
// *binding.Provisioner).
type Provisioner interface {
	Provision(ctx context.Context, c binding.Consumer, clusterID string, resources []binding.Resource) (*v1alpha1.BindingResponse, error)
}

// Catalog says which APIs a consumer may bind (implemented by
// *binding.Catalog).
type Catalog interface {
	Lookup(group, resource string) (binding.ExportedAPI, bool)
}

// Config configures a Service.
type Config struct {
	// Store keeps the sessions. Required.
	Store sessions.Store
	// ClusterKey issues cluster IDs and their secrets. Required.
	ClusterKey *clusterkey.Key
	// SessionTTL is how long a session lives (default sessions.DefaultTTL).
	SessionTTL time.Duration
	// Now is the clock of creation times (default time.Now).
	Now func() time.Time
	// Catalog and Provisioner are needed for Select and Bind only.
	Catalog     Catalog
	Provisioner Provisioner
}

// Service runs the session lifecycle.
type Service struct{ cfg Config }

// New checks cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.ClusterKey == nil {
		return nil, errors.New("bindservice: Store and ClusterKey are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = sessions.DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg}, nil
}

// SessionTTL is the life of the sessions the service creates.
func (s *Service) SessionTTL() time.Duration { return s.cfg.SessionTTL }

// ErrBusy: the store holds as many sessions as it may; try again later
// (sessions.ErrFull).
var ErrBusy = sessions.ErrFull

// CreatePollSession creates a session of the poll flow (§1). A presented
// cluster ID that is empty or not of a format this backend accepts
// (ids.ValidClusterID) is replaced by a new one derived from the session
// ID, and clusterSecret is its secret; a presented one is kept without a
// secret (it is used only if the link proves it, see clusterkey).
func (s *Service) CreatePollSession(ctx context.Context, presentedClusterID string) (sess sessions.Session, clusterSecret string, err error) {
	sess = s.newSession()
	sess.ClusterID = presentedClusterID
	if !ids.ValidClusterID(sess.ClusterID) {
		sess.ClusterID = s.cfg.ClusterKey.NewClusterID(sess.ID)
		clusterSecret = s.cfg.ClusterKey.Secret(sess.ClusterID)
	}
	if err := s.create(ctx, sess); err != nil {
		return sessions.Session{}, "", err
	}
	return sess, clusterSecret, nil
}

// CreateCallbackSession creates the session of a callback-flow login: the
// released CLI's cluster ID and session ID, and the checked callback URL
// the response goes to.
func (s *Service) CreateCallbackSession(ctx context.Context, clusterID, callbackURL, cliSessionID string) (sessions.Session, error) {
	sess := s.newSession()
	sess.ClusterID = clusterID
	sess.CallbackURL = callbackURL
	sess.CallbackSessionID = cliSessionID
	if err := s.create(ctx, sess); err != nil {
		return sessions.Session{}, err
	}
	return sess, nil
}

func (s *Service) newSession() sessions.Session {
	now := s.cfg.Now()
	expires := now.Add(s.cfg.SessionTTL)
	return sessions.Session{
		ID:        ids.NewExpiringSessionID(expires),
		Secret:    ids.NewSessionSecret(),
		CreatedAt: now,
		ExpiresAt: expires,
		State:     sessions.StatePending,
	}
}

// create stores sess: ErrBusy at the limit, else the store's error.
// (sessions.ErrExists would need a collision of 128 random bits; it is
// a store failure like any other.)
func (s *Service) create(ctx context.Context, sess sessions.Session) error {
	if err := s.cfg.Store.Create(ctx, sess); err != nil {
		if errors.Is(err, sessions.ErrFull) {
			return ErrBusy
		}
		return fmt.Errorf("creating a session: %w", err)
	}
	return nil
}

// SelectionError says what is wrong with the APIs a user picked, in words
// for the user.
type SelectionError struct{ Problem string }

func (e *SelectionError) Error() string { return e.Problem }

// Select turns the picked API IDs (<resource>.<group>) into resources,
// dropping repeats and keeping the order. Nothing may be provisioned
// unless every one is exported: else a *SelectionError.
func (s *Service) Select(picked []string) ([]binding.Resource, []string, error) {
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

// Errors of Bind besides *SelectionError and the store's.
var (
	// ErrAlreadyDone: the session was completed or denied before (a
	// second submit of the same form).
	ErrAlreadyDone = errors.New("the session is not pending any more")
	// ErrProvisioning: the provider cluster could not set the consumer
	// up (the cause is wrapped; nothing the user did).
	ErrProvisioning = errors.New("provisioning failed")
)

// Bind provisions consumer with resources under clusterID, fills the
// response for sess's flow (the CLI's session ID in the callback flow)
// and completes sess with it. It returns the BindingResponse as stored.
func (s *Service) Bind(ctx context.Context, sess sessions.Session, consumer binding.Consumer, clusterID string, resources []binding.Resource) ([]byte, error) {
	resp, err := s.cfg.Provisioner.Provision(ctx, consumer, clusterID, resources)
	var ne *binding.NotExportedError
	if errors.As(err, &ne) {
		// The catalog changed since Select.
		return nil, notOffered(ne.Resource + "." + ne.Group)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProvisioning, err)
	}
	sid := sess.ID
	if sess.CallbackURL != "" {
		sid = sess.CallbackSessionID
	}
	resp.Authentication.OAuth2CodeGrant = &v1alpha1.CodeGrantAuthentication{SessionID: sid, ID: consumer.ID()}
	body, err := json.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("encoding the binding response: %w", err)
	}
	switch err := s.cfg.Store.Complete(ctx, sess.ID, body); {
	case errors.Is(err, sessions.ErrNotPending):
		return nil, ErrAlreadyDone
	case err != nil:
		return nil, err
	}
	return body, nil
}

// Deny ends a pending session with reason, which its poll reports. A
// session that is not pending any more is left as it is (nil).
func (s *Service) Deny(ctx context.Context, sid, reason string) error {
	if err := s.cfg.Store.Deny(ctx, sid, reason); err != nil && !errors.Is(err, sessions.ErrNotPending) {
		return err
	}
	return nil
}

package pollclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/protocol"
)

// createAttempts bounds how often CreateSession asks a busy provider.
const createAttempts = 5

// Session is an open poll session. Its secret stays inside: String,
// GoString and LogValue leave it out.
type Session struct {
	// ID names the session; it shows in the browser's address bar and is
	// not a secret.
	ID string
	// ClusterID is the cluster ID the provider issued (or kept). Present it
	// to CreateSession next time to land in the same provider namespace.
	ClusterID string
	// ExpiresAt is when the provider forgets the session, by its clock.
	ExpiresAt time.Time

	provider *Provider
	client   *Client
	secret   string
	// clusterSecret came with a newly issued ClusterID (see ClusterSecret).
	clusterSecret string
	// deadline is ExpiresAt on the local clock, corrected by the offset
	// between the provider's Date header and the local clock.
	deadline time.Time
}

// ClusterSecret is the secret the provider issued with a new cluster ID
// (empty when it issued none). Keep it with ClusterID, as secret as a
// password: it proves on later sessions that present ClusterID that the
// client holds that ID (AuthenticationURLWithProof).
func (s *Session) ClusterSecret() string { return s.clusterSecret }

// String describes the session without its secret.
func (s Session) String() string {
	return fmt.Sprintf("pollclient.Session{ID:%s ClusterID:%s ExpiresAt:%s}", s.ID, s.ClusterID, s.ExpiresAt.Format(time.RFC3339))
}

// GoString keeps %#v from printing the secret.
func (s Session) GoString() string { return s.String() }

// LogValue keeps log/slog from printing the secret.
func (s Session) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", s.ID), slog.String("clusterID", s.ClusterID), slog.Time("expiresAt", s.ExpiresAt))
}

// Provider returns the provider the session belongs to.
func (s *Session) Provider() *Provider { return s.provider }

// CreateSession opens a poll session at p. A client that was bound before
// passes the clusterID it was given then (Session.ClusterID), so that its
// new bindings land in the same provider namespace; "" asks for a new one.
// A provider at its session limit (503) is asked again after its
// Retry-After, a few times.
func (c *Client) CreateSession(ctx context.Context, p *Provider, clusterID string) (*Session, error) {
	if p == nil || p.SessionURL == nil || p.PollURL == nil || p.AuthenticatedURL == nil {
		return nil, errors.New("pollclient: CreateSession needs a Provider from Discover")
	}
	var body []byte
	if clusterID != "" {
		body, _ = json.Marshal(v1alpha1.CreateSessionRequest{ClusterID: clusterID})
	}
	b := backoff{base: time.Second, max: 30 * time.Second}
	var lastErr error
	for attempt := 1; attempt <= createAttempts; attempt++ {
		s, wait, err := c.createSessionOnce(ctx, p, body)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if wait < 0 { // terminal
			return nil, err
		}
		lastErr = err
		if attempt == createAttempts {
			break
		}
		if wait == 0 {
			wait = b.next()
		}
		if err := c.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: creating a session at %s failed %d times, last: %v", ErrUnavailable, p.SessionURL, createAttempts, lastErr)
}

// createSessionOnce makes one attempt. wait < 0 means the error is
// terminal; 0 means retry with backoff; > 0 means retry after wait.
func (c *Client) createSessionOnce(ctx context.Context, p *Provider, body []byte) (*Session, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.SessionURL.String(), bytes.NewReader(body))
	if err != nil {
		return nil, -1, err
	}
	req.Header.Set("Accept", "application/json")
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(c.api, req)
	if err != nil {
		return nil, 0, fmt.Errorf("creating a session: %w", err)
	}
	raw, err := readBody(resp, c.MaxBodyBytes)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the new session: %w", err)
	}
	now := c.now()
	switch {
	case resp.StatusCode == http.StatusCreated:
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		wait, _ := retryAfter(resp.Header, now)
		return nil, wait, fmt.Errorf("creating a session: %w", newServerError(resp.StatusCode, errorBody(raw)))
	case resp.StatusCode >= 500:
		return nil, 0, fmt.Errorf("creating a session: %w", newServerError(resp.StatusCode, errorBody(raw)))
	default:
		return nil, -1, fmt.Errorf("creating a session: %w", newServerError(resp.StatusCode, errorBody(raw)))
	}
	var ps v1alpha1.PollSession
	if err := decodeJSON(resp, raw, &ps); err != nil {
		return nil, -1, fmt.Errorf("new session: %w", err)
	}
	switch {
	case !sessionAPIVersionOK(p, ps.APIVersion) || ps.Kind != v1alpha1.KindPollSession:
		return nil, -1, fmt.Errorf("%w: new session is %s %s, want %s %s", ErrInvalidResponse, ps.APIVersion, ps.Kind, v1alpha1.GroupVersion, v1alpha1.KindPollSession)
	case ps.SessionID == "" || ps.SessionSecret == "" || ps.ClusterID == "":
		return nil, -1, fmt.Errorf("%w: new session lacks sessionID, sessionSecret or clusterID", ErrInvalidResponse)
	case ps.ExpiresAt.IsZero():
		return nil, -1, fmt.Errorf("%w: new session lacks expiresAt", ErrInvalidResponse)
	}
	// Measure the session's life against the provider's clock, so that a
	// skewed local clock neither cuts it short nor stretches it.
	deadline := ps.ExpiresAt
	if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		deadline = now.Add(ps.ExpiresAt.Sub(d))
	}
	return &Session{
		ID:            ps.SessionID,
		ClusterID:     ps.ClusterID,
		ExpiresAt:     ps.ExpiresAt,
		provider:      p,
		client:        c,
		secret:        ps.SessionSecret,
		clusterSecret: ps.ClusterSecret,
		deadline:      deadline,
	}, 0, nil
}

// sessionAPIVersionOK says whether a new session of p may have apiVersion
// v. The session object is the same in both generations; a v1alpha2
// provider may label it with either group version.
func sessionAPIVersionOK(p *Provider, v string) bool {
	if v == v1alpha1.GroupVersion {
		return true
	}
	return p.Generation == v1alpha2.ProviderAPIVersion && v == v1alpha2.GroupVersion
}

// AuthenticationURL returns the signed URL the user opens in a browser to
// log in and pick the APIs. Each call signs with a fresh nonce, and the
// provider accepts each nonce once, so each URL can be opened once.
func (s *Session) AuthenticationURL() (string, error) {
	return s.AuthenticationURLWithProof("")
}

// AuthenticationURLWithProof is AuthenticationURL for a session that
// presented a cluster ID with its cluster secret: it adds the cluster proof
// (protocol.ClusterProof(clusterSecret, s.ID)) as query parameter
// protocol.ProofParam before signing, so the signature covers it. With an
// empty clusterSecret it is AuthenticationURL.
func (s *Session) AuthenticationURLWithProof(clusterSecret string) (string, error) {
	u := *s.provider.AuthenticatedURL
	if clusterSecret != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return "", err
		}
		q.Set(protocol.ProofParam, protocol.ClusterProof(clusterSecret, s.ID))
		u.RawQuery = q.Encode()
	}
	signed, err := protocol.SignURL(s.secret, s.ID, http.MethodGet, &u, nil)
	if err != nil {
		return "", err
	}
	return signed.String(), nil
}

// ConfirmationCode is the code the provider's page shows for this session
// (protocol.ConfirmationCode): print it next to the URL so the user can
// check the page belongs to their own session.
func (s *Session) ConfirmationCode() string { return protocol.ConfirmationCode(s.ID) }

package pollclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// DefaultMaxBodyBytes bounds every answer the client reads.
const DefaultMaxBodyBytes = 4 << 20

// minProtocolVersion is the lowest provider version released kube-bind CLIs
// accept; v0.0.0 (an unstamped development build) is accepted too.
var minProtocolVersion = version.MustParseSemantic("v0.3.0")

// Client talks to kube-bind providers. The zero value is not usable; make
// one with New. A Client is safe for concurrent use.
type Client struct {
	// discovery follows redirects as released CLIs do; api does not, since a
	// redirect would change what a signature covers.
	discovery *http.Client
	api       *http.Client

	// MaxBodyBytes bounds every answer read; New sets DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// UserAgent is sent with every request when not empty.
	UserAgent string

	// now and sleep are replaced in tests.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// New returns a client that sends its requests with hc, or with a client
// with a one-minute timeout per request when hc is nil. hc itself is not
// changed.
func New(hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: time.Minute}
	}
	api := *hc
	api.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{
		discovery:    hc,
		api:          &api,
		MaxBodyBytes: DefaultMaxBodyBytes,
		UserAgent:    "kube-bind-pollclient",
		now:          time.Now,
		sleep:        sleepCtx,
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Provider is a provider's discovery document, checked, with the poll
// method picked out.
type Provider struct {
	// ExportURL is the URL the document was fetched from (before redirects).
	ExportURL string
	// PrettyName is the provider's name for people.
	PrettyName string
	// Version is the protocol level the provider speaks.
	Version string
	// SessionURL, AuthenticatedURL and PollURL are the poll method's URLs.
	SessionURL       *url.URL
	AuthenticatedURL *url.URL
	PollURL          *url.URL
	// PollInterval is how long to wait between polls.
	PollInterval time.Duration
	// LongPollMaxWait is how long the provider holds a poll that asks to
	// wait for the session's end (discovery's optional longPollMaxWait);
	// 0 when it does not offer long polling.
	LongPollMaxWait time.Duration
	// Document is the discovery document as received.
	Document v1alpha1.BindingProvider
	// Generation is the protocol generation the document speaks, its bare
	// apiVersion (v1alpha1.ProviderAPIVersion or
	// v1alpha2.ProviderAPIVersion): the BindingResponse a session of this
	// provider ends in must be of the same generation.
	Generation string
}

// Discover fetches the discovery document at exportURL, exactly as given
// (no path is added; redirects are followed), and picks the poll method.
// It fails with ErrNoPollMethod when the provider offers only the callback
// flow, and with ErrUnsupportedProvider when the document is not one this
// client speaks.
func (c *Client) Discover(ctx context.Context, exportURL string) (*Provider, error) {
	doc, err := c.FetchDocument(ctx, exportURL)
	if err != nil {
		return nil, err
	}
	return ProviderOf(exportURL, *doc)
}

// FetchDocument fetches the discovery document at exportURL, exactly as
// given, and checks what every flow needs (apiVersion, version), without
// picking a method: for clients that also speak the callback flow
// (CodeGrantURL). ProviderOf then picks the poll method.
func (c *Client) FetchDocument(ctx context.Context, exportURL string) (*v1alpha1.BindingProvider, error) {
	return c.fetchDocument(ctx, exportURL, v1alpha1.ProviderAPIVersion)
}

// fetchDocument is FetchDocument for a document of the generation
// apiVersion.
func (c *Client) fetchDocument(ctx context.Context, exportURL, apiVersion string) (*v1alpha1.BindingProvider, error) {
	u, err := url.Parse(exportURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("export URL %q must be an absolute http or https URL", exportURL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.do(c.discovery, req)
	if err != nil {
		return nil, fmt.Errorf("fetching provider at %s: %w", exportURL, err)
	}
	body, err := readBody(resp, c.MaxBodyBytes)
	if err != nil {
		return nil, fmt.Errorf("reading provider at %s: %w", exportURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		se := newServerError(resp.StatusCode, errorBody(body))
		se.kind = ErrUnsupportedProvider
		if resp.StatusCode >= 500 {
			se.kind = ErrUnavailable
		}
		return nil, fmt.Errorf("fetching provider at %s: %w", exportURL, se)
	}
	var doc v1alpha1.BindingProvider
	if err := decodeJSON(resp, body, &doc); err != nil {
		return nil, fmt.Errorf("provider at %s: %w", exportURL, err)
	}
	if err := checkDocument(doc, apiVersion); err != nil {
		return nil, fmt.Errorf("provider at %s: %w", exportURL, err)
	}
	return &doc, nil
}

// ProviderDocumentURL is where a v1alpha2 provider serves its discovery
// document: /api/exports at the root of the host of serverURL, whatever
// path serverURL has (as the released kubectl-bind v0.7/v0.8 finds it).
func ProviderDocumentURL(serverURL string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("URL %q must be an absolute http or https URL", serverURL)
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/api/exports"}).String(), nil
}

// DiscoverV1alpha2 fetches the kube-bind.io/v1alpha2 discovery document of
// the provider at serverURL (from ProviderDocumentURL) and picks its poll
// method. It fails with ErrUnsupportedProvider when the host serves no
// v1alpha2 document there, and with ErrNoPollMethod when the document
// offers no poll flow (released v1alpha2 providers offer only the
// callback flow of kubectl-bind).
func (c *Client) DiscoverV1alpha2(ctx context.Context, serverURL string) (*Provider, error) {
	docURL, err := ProviderDocumentURL(serverURL)
	if err != nil {
		return nil, err
	}
	doc, err := c.fetchDocument(ctx, docURL, v1alpha2.ProviderAPIVersion)
	if err != nil {
		return nil, err
	}
	p, err := checkProvider(*doc, v1alpha2.ProviderAPIVersion)
	if err != nil {
		return nil, fmt.Errorf("provider at %s: %w", docURL, err)
	}
	p.ExportURL = docURL
	return p, nil
}

// ProviderOf picks the poll method of a discovery document from
// FetchDocument (fetched from exportURL). It fails with ErrNoPollMethod
// when the document offers only the callback flow.
func ProviderOf(exportURL string, doc v1alpha1.BindingProvider) (*Provider, error) {
	p, err := checkProvider(doc, v1alpha1.ProviderAPIVersion)
	if err != nil {
		return nil, fmt.Errorf("provider at %s: %w", exportURL, err)
	}
	p.ExportURL = exportURL
	return p, nil
}

// CodeGrantURL returns the authenticatedURL of the document's first
// callback-flow (OAuth2CodeGrant) method, the one released CLIs pick, or
// ErrNoCodeGrantMethod.
func CodeGrantURL(doc v1alpha1.BindingProvider) (*url.URL, error) {
	for _, m := range doc.AuthenticationMethods {
		if m.Method == v1alpha1.MethodOAuth2CodeGrant && m.OAuth2CodeGrant != nil {
			return absURL("authenticatedURL", m.OAuth2CodeGrant.AuthenticatedURL)
		}
	}
	return nil, ErrNoCodeGrantMethod
}

// checkDocument applies the checks of released CLIs that hold for every
// method, for a document of the generation apiVersion.
func checkDocument(doc v1alpha1.BindingProvider, apiVersion string) error {
	if doc.APIVersion != apiVersion {
		return fmt.Errorf("%w: apiVersion %q, want %q", ErrUnsupportedProvider, doc.APIVersion, apiVersion)
	}
	return checkVersion(doc.Version)
}

// checkProvider applies the checks of released CLIs and picks the first
// usable poll method.
func checkProvider(doc v1alpha1.BindingProvider, apiVersion string) (*Provider, error) {
	if err := checkDocument(doc, apiVersion); err != nil {
		return nil, err
	}
	p := &Provider{PrettyName: doc.ProviderPrettyName, Version: doc.Version, Document: doc, Generation: apiVersion}
	for _, m := range doc.AuthenticationMethods {
		if m.Method != v1alpha1.MethodOAuth2CodeGrantPoll || m.OAuth2CodeGrantPoll == nil {
			continue
		}
		poll := m.OAuth2CodeGrantPoll
		var err error
		if p.SessionURL, err = absURL("sessionURL", poll.SessionURL); err != nil {
			return nil, err
		}
		if p.AuthenticatedURL, err = absURL("authenticatedURL", poll.AuthenticatedURL); err != nil {
			return nil, err
		}
		if p.PollURL, err = absURL("pollURL", poll.PollURL); err != nil {
			return nil, err
		}
		d, err := time.ParseDuration(poll.PollInterval)
		if err != nil || d <= 0 || d > time.Hour {
			return nil, fmt.Errorf("%w: pollInterval %q is not a duration between 0 and 1h", ErrUnsupportedProvider, poll.PollInterval)
		}
		p.PollInterval = d
		// An optional extension: a value this client cannot read is
		// ignored (plain polling), not an error.
		if lp, err := time.ParseDuration(poll.LongPollMaxWait); err == nil && lp > 0 {
			p.LongPollMaxWait = lp
		}
		return p, nil
	}
	for _, m := range doc.AuthenticationMethods {
		if m.Method == v1alpha1.MethodOAuth2CodeGrant {
			return nil, fmt.Errorf("%w: it offers only the callback flow (OAuth2CodeGrant); use kubectl bind for it", ErrNoPollMethod)
		}
	}
	return nil, ErrNoPollMethod
}

// checkVersion accepts what released CLIs accept: v0.0.0, or a strict
// semantic version of at least v0.3.0.
func checkVersion(v string) error {
	if v == "" {
		return fmt.Errorf("%w: the provider states no version", ErrUnsupportedProvider)
	}
	sv, err := version.ParseSemantic(v)
	if err != nil {
		return fmt.Errorf("%w: version %q is not a semantic version", ErrUnsupportedProvider, v)
	}
	if sv.Major() == 0 && sv.Minor() == 0 && sv.Patch() == 0 && sv.PreRelease() == "" {
		return nil
	}
	if sv.LessThan(minProtocolVersion) {
		return fmt.Errorf("%w: version %s is older than %s", ErrUnsupportedProvider, v, minProtocolVersion)
	}
	return nil
}

func absURL(field, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%w: %s %q is not an absolute http or https URL", ErrUnsupportedProvider, field, raw)
	}
	return u, nil
}

func (c *Client) do(hc *http.Client, req *http.Request) (*http.Response, error) {
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	return hc.Do(req)
}

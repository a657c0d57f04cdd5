// Package flow gets a BindingResponse from a kube-bind provider for a
// command line client: it picks the protocol generation (kube-bind.io/v1alpha2
// when the provider's host serves a v1alpha2 document with the poll flow at
// /api/exports, else v1alpha1 at the URL as given; only among those that
// fit the consumer cluster, Options.Fits), reads the discovery
// document, takes the poll flow when the provider offers it (it works over
// SSH) and the callback flow otherwise (every released v1alpha1 provider
// offers it), shows the user the URL to open (prominently, with the
// confirmation code and, on a terminal, a QR code for a phone), and waits.
// Choose makes the choice alone, from the documents, opening no session.
package flow

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"time"

	"github.com/mdp/qrterminal/v3"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/callbackflow"
	"github.com/kbprovider/backend/pkg/pollclient"
)

// Protocol generations to force with Options.Protocol.
const (
	ProtocolAuto     = ""
	ProtocolV1alpha1 = v1alpha1.ProviderAPIVersion
	ProtocolV1alpha2 = v1alpha2.ProviderAPIVersion
)

// Flows to force with Options.Flow.
const (
	FlowAuto     = ""
	FlowPoll     = "poll"
	FlowCallback = "callback"
)

// Options configure Obtain.
type Options struct {
	HTTPClient *http.Client
	UserAgent  string
	// Flow forces a flow; FlowAuto takes poll when offered.
	Flow string
	// Protocol forces a generation; ProtocolAuto takes v1alpha2 when the
	// provider offers its poll flow and it fits. This client speaks
	// v1alpha2 through the poll flow only.
	Protocol string
	// Fits, when set, says whether a bind through a generation fits the
	// consumer cluster (its konnector): nil, or why not and what to do.
	// Auto skips a generation that does not fit; a forced one that does
	// not fit is refused before the provider is asked.
	Fits func(protocol string) error
	// CallbackWait bounds the wait for the browser in the callback flow,
	// which has no session expiry of its own; default DefaultCallbackWait.
	CallbackWait time.Duration
	// ClusterID to present ("" for a new one) and ClusterSecret to prove it
	// with (poll flow, backends that issue one).
	ClusterID, ClusterSecret string
	// Out receives the URL and the waiting messages (stderr).
	Out io.Writer
	// QR draws a QR code of the URL on Out (for an interactive terminal).
	QR bool
	// OpenBrowser, when set, is called with the URL.
	OpenBrowser func(url string) error
	// Progress, when set, receives every poll that did not end the wait.
	Progress func(pollclient.Progress)
	// BeforeWait is called after the URL is shown (tests, timing).
	BeforeWait func(url string)
}

// ErrCallbackTimeout is the callback flow's wait running out.
var ErrCallbackTimeout = errors.New("gave up waiting for the browser")

// DefaultCallbackWait is how long the callback flow waits for the
// browser by default: as long as a login's state lives at this backend.
const DefaultCallbackWait = 10 * time.Minute

// Result is what the provider handed over, and the identity it knows the
// cluster by.
type Result struct {
	*pollclient.Result
	Flow string
	// Protocol is the generation bound through (Result.Generation).
	Protocol      string
	ClusterID     string
	ClusterSecret string // newly issued with ClusterID, else ""
	ProviderName  string
}

// Choice is the generation and flow a bind at a provider takes, as its
// discovery documents decided. Choosing reads documents only: no session
// is opened, nothing is made at the provider.
type Choice struct {
	// Protocol is the generation (ProtocolV1alpha1 or ProtocolV1alpha2),
	// Flow FlowPoll or FlowCallback.
	Protocol, Flow string
	ProviderName   string

	client    *pollclient.Client
	poll      *pollclient.Provider // poll flow
	codeGrant *url.URL             // callback flow
}

// Choose reads the provider's discovery documents and picks the
// generation and the flow.
func Choose(ctx context.Context, exportURL string, o Options) (*Choice, error) {
	c := pollclient.New(o.HTTPClient)
	if o.UserAgent != "" {
		c.UserAgent = o.UserAgent
	}
	p2, err := selectV1alpha2(ctx, c, exportURL, o)
	if err != nil {
		return nil, err
	}
	if p2 != nil {
		return &Choice{Protocol: ProtocolV1alpha2, Flow: FlowPoll, ProviderName: prettyName(p2.PrettyName), client: c, poll: p2}, nil
	}
	if err := o.fits(ProtocolV1alpha1); err != nil {
		if o.Protocol == ProtocolAuto && o.Flow != FlowCallback {
			if unfit := o.fits(ProtocolV1alpha2); unfit != nil {
				if unfit.Error() == err.Error() {
					return nil, fmt.Errorf("no protocol generation fits this cluster: %w", err)
				}
				return nil, fmt.Errorf("no protocol generation fits this cluster: %s: %w; %s: %w", v1alpha2.GroupVersion, unfit, v1alpha1.GroupVersion, err)
			}
			where, _ := pollclient.ProviderDocumentURL(exportURL)
			return nil, fmt.Errorf("the provider offers no %s poll flow at %s, and %s does not fit this cluster: %w",
				v1alpha2.GroupVersion, where, v1alpha1.GroupVersion, err)
		}
		msg := fmt.Sprintf("%s does not fit this cluster: %%w", v1alpha1.GroupVersion)
		switch {
		case o.Flow == FlowCallback:
			msg += "; --flow callback binds through " + v1alpha1.GroupVersion + " only: leave it out"
		case o.fits(ProtocolV1alpha2) == nil:
			msg += "; or leave out --protocol to bind through " + v1alpha2.GroupVersion + " where the provider offers it"
		}
		return nil, fmt.Errorf(msg, err)
	}
	doc, err := c.FetchDocument(ctx, exportURL)
	if err != nil {
		if unfit := o.fits(ProtocolV1alpha2); unfit != nil && o.Protocol == ProtocolAuto && ctx.Err() == nil {
			// Say why v1alpha2 was not taken when the provider may offer only that.
			if _, err2 := c.DiscoverV1alpha2(ctx, exportURL); err2 == nil {
				return nil, fmt.Errorf("the provider offers %s only (%s: %w), and %s does not fit this cluster: %w",
					v1alpha2.GroupVersion, exportURL, err, v1alpha2.GroupVersion, unfit)
			}
		}
		return nil, err
	}
	ch := &Choice{Protocol: ProtocolV1alpha1, Flow: o.Flow, ProviderName: prettyName(doc.ProviderPrettyName), client: c}
	if ch.Flow == FlowAuto {
		ch.Flow = FlowCallback
		if _, err := pollclient.ProviderOf(exportURL, *doc); err == nil {
			ch.Flow = FlowPoll
		}
	}
	switch ch.Flow {
	case FlowPoll:
		if ch.poll, err = pollclient.ProviderOf(exportURL, *doc); err != nil {
			return nil, err
		}
	case FlowCallback:
		if ch.codeGrant, err = pollclient.CodeGrantURL(*doc); err != nil {
			return nil, fmt.Errorf("provider at %s: %w", exportURL, err)
		}
	default:
		return nil, fmt.Errorf("unknown flow %q (want %s or %s)", ch.Flow, FlowPoll, FlowCallback)
	}
	return ch, nil
}

func prettyName(name string) string {
	if name == "" {
		return "the provider"
	}
	return name
}

// Obtain runs the flow and returns the provider's BindingResponse.
func Obtain(ctx context.Context, exportURL string, o Options) (*Result, error) {
	ch, err := Choose(ctx, exportURL, o)
	if err != nil {
		return nil, err
	}
	return ch.Obtain(ctx, o)
}

// Obtain opens the session of the chosen flow, shows the user the URL and
// waits for the provider's BindingResponse.
func (ch *Choice) Obtain(ctx context.Context, o Options) (*Result, error) {
	if ch.poll != nil {
		return o.poll(ctx, ch.client, ch.poll, ch.ProviderName)
	}
	cid := o.ClusterID
	if cid == "" {
		var err error
		if cid, err = newCLIClusterID(); err != nil {
			return nil, err
		}
	}
	f, err := callbackflow.Start(ch.codeGrant, cid)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bound := o.CallbackWait
	if bound <= 0 {
		bound = DefaultCallbackWait
	}
	o.show(ch.ProviderName, f.URL(), "in a browser on this machine (it returns to a port of this machine)", "", time.Now().Add(bound))
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	res, err := f.Wait(wctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: no binding came back to this machine within %s: open the URL in a browser on this machine, "+
			"log in and press Bind; run the command again for a new link (--flow poll binds from a browser anywhere, where the provider offers it)",
			ErrCallbackTimeout, bound)
	}
	r := &Result{Result: res, Flow: FlowCallback, Protocol: res.Generation, ClusterID: cid, ProviderName: ch.ProviderName}
	if cid == o.ClusterID {
		r.ClusterSecret = o.ClusterSecret
	}
	return r, nil
}

// selectV1alpha2 returns the v1alpha2 provider to bind through, or nil to
// go on with v1alpha1 at the URL as given. Auto takes v1alpha2 only when
// the host serves a v1alpha2 document with the poll flow; any other
// answer (none, an error, v1alpha1, only the callback flow) falls back, so
// v1alpha1 providers are bound through the v1alpha1 flow.
func selectV1alpha2(ctx context.Context, c *pollclient.Client, exportURL string, o Options) (*pollclient.Provider, error) {
	switch o.Protocol {
	case ProtocolV1alpha1:
		return nil, nil
	case ProtocolV1alpha2:
		if o.Flow == FlowCallback {
			return nil, fmt.Errorf("this client binds through %s with the poll flow only; leave out --flow callback", v1alpha2.GroupVersion)
		}
		if err := o.fits(ProtocolV1alpha2); err != nil {
			msg := fmt.Sprintf("%s does not fit this cluster: %%w", v1alpha2.GroupVersion)
			if o.fits(ProtocolV1alpha1) == nil {
				msg += "; or leave out --protocol to bind through " + v1alpha1.GroupVersion
			}
			return nil, fmt.Errorf(msg, err)
		}
		p, err := c.DiscoverV1alpha2(ctx, exportURL)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v1alpha2.GroupVersion, err)
		}
		return p, nil
	case ProtocolAuto:
		if o.Flow == FlowCallback || o.fits(ProtocolV1alpha2) != nil {
			return nil, nil
		}
		p, err := c.DiscoverV1alpha2(ctx, exportURL)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, nil
		}
		return p, nil
	default:
		return nil, fmt.Errorf("unknown protocol %q (want %s or %s)", o.Protocol, ProtocolV1alpha1, ProtocolV1alpha2)
	}
}

func (o Options) fits(protocol string) error {
	if o.Fits == nil {
		return nil
	}
	return o.Fits(protocol)
}

// poll runs the poll flow at p, named name.
func (o Options) poll(ctx context.Context, c *pollclient.Client, p *pollclient.Provider, name string) (*Result, error) {
	s, err := c.CreateSession(ctx, p, o.ClusterID)
	if err != nil {
		return nil, err
	}
	secret := o.ClusterSecret
	if s.ClusterID != o.ClusterID {
		secret = "" // the provider issued another ID: the proof of the old one means nothing
	}
	u, err := s.AuthenticationURLWithProof(secret)
	if err != nil {
		return nil, err
	}
	o.show(name, u, "in a browser (on any machine)", s.ConfirmationCode(), s.ExpiresAt)
	var opts []pollclient.WaitOption
	if o.Progress != nil {
		opts = append(opts, pollclient.WithProgress(o.Progress))
	}
	res, err := s.Wait(ctx, opts...)
	if err != nil {
		return nil, err
	}
	r := &Result{Result: res, Flow: FlowPoll, Protocol: res.Generation, ClusterID: s.ClusterID, ProviderName: name}
	if s.ClusterID == o.ClusterID {
		r.ClusterSecret = o.ClusterSecret
	} else {
		r.ClusterSecret = s.ClusterSecret()
	}
	return r, nil
}

func (o Options) show(provider, u, where, code string, expires time.Time) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	fmt.Fprintf(out, "\nTo bind APIs of %s, open this URL %s, log in and pick the APIs:\n\n    %s\n\n", provider, where, u)
	if code != "" {
		fmt.Fprintf(out, "The page will show the code %s; continue only if it matches.\n", code)
	}
	if o.QR {
		qrterminal.GenerateWithConfig(u, qrterminal.Config{
			Level: qrterminal.L, Writer: out, HalfBlocks: true, QuietZone: 1,
			BlackChar: qrterminal.BLACK_BLACK, WhiteBlackChar: qrterminal.WHITE_BLACK,
			WhiteChar: qrterminal.WHITE_WHITE, BlackWhiteChar: qrterminal.BLACK_WHITE,
		})
	}
	if o.OpenBrowser != nil {
		if err := o.OpenBrowser(u); err != nil {
			fmt.Fprintf(out, "(could not open a browser: %v; open the URL yourself)\n", err)
		}
	}
	if expires.IsZero() {
		fmt.Fprintf(out, "Waiting until you are done (Ctrl-C to stop)...\n")
	} else {
		fmt.Fprintf(out, "Waiting until you are done (the link expires at %s; Ctrl-C to stop)...\n", expires.Local().Format("15:04:05 MST"))
	}
	if o.BeforeWait != nil {
		o.BeforeWait(u)
	}
}

// newCLIClusterID makes a cluster ID in the released CLI's format (6
// characters of 0-9a-zA-Z), for the callback flow's first bind.
func newCLIClusterID() (string, error) {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	b := make([]byte, 6)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", err
		}
		b[i] = alphabet[n.Int64()]
	}
	return string(b), nil
}

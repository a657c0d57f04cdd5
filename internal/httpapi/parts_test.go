package httpapi

import (
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	apiv1alpha1 "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	apiv1alpha2 "github.com/kbprovider/backend/internal/httpapi/v1alpha2"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// partsOpts configure the parts of a test backend.
type partsOpts struct {
	// browser is the browser part (nil: browser.Unconfigured).
	browser        *browser.Handler
	interval       time.Duration
	noCallbackFlow bool
	longPoll       *longpoll.Holder
	// v1alpha2 mounts the v1alpha2 generation too.
	v1alpha2 bool
}

// testParts are the parts of a test backend over svc: v1alpha1, the
// browser part, and v1alpha2 when asked; the poll sessions' counter is
// registered in reg.
func testParts(t testing.TB, ext *url.URL, svc *lifecycle.Service, reg prometheus.Registerer, o partsOpts) []mount.Part {
	t.Helper()
	sessions, err := pollsession.New(svc, reg)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := apiv1alpha1.New(apiv1alpha1.Config{ExternalURL: ext, PrettyName: "MangoDB Inc.", PollInterval: o.interval,
		LongPollMaxWait: o.longPoll.MaxWait(), NoCallbackFlow: o.noCallbackFlow, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	parts := []mount.Part{v1}
	if o.browser != nil {
		parts = append(parts, o.browser)
	} else {
		parts = append(parts, browser.Unconfigured{})
	}
	if o.v1alpha2 {
		v2, err := apiv1alpha2.New(apiv1alpha2.Config{ExternalURL: ext, PrettyName: "MangoDB Inc.", Sessions: svc,
			PollSessions: sessions, PollInterval: o.interval, NoCallbackFlow: o.noCallbackFlow})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, v2)
	}
	return parts
}

// callbackSession issues a session of the v1alpha1 callback flow.
func callbackSession(svc *lifecycle.Service, callbackURL, cliSession string) lifecycle.Session {
	sess, _, _ := svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowCallback, CallbackURL: callbackURL, CallbackSessionID: cliSession})
	return sess
}

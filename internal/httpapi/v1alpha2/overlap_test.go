package v1alpha2

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

// overlapOffers: widgets offered by its CRD and by a template that
// repeats it exactly (the page shows one of them), gadgets by its CRD
// and by a template with a claim (both shown, each marked).
var overlapOffers = fakes.Offers{Items: []offers.Offer{
	{Name: "gadgets.example.com", Implicit: true, SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Resources: []v1alpha2.Resource{{Group: "example.com", Resource: "gadgets", Versions: []string{"v1"}}}},
	{Name: "gadgets-with-secrets", SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Resources:        []v1alpha2.Resource{{Group: "example.com", Resource: "gadgets", Versions: []string{"v1"}}},
		PermissionClaims: []v1alpha2.PermissionClaim{{Resource: "secrets"}}},
	{Name: "widgets", Description: "Widgets", SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Resources: []v1alpha2.Resource{{Group: "example.com", Resource: "widgets", Versions: []string{"v1"}}}},
	{Name: "widgets.example.com", Implicit: true, SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Resources: []v1alpha2.Resource{{Group: "example.com", Resource: "widgets", Versions: []string{"v1"}}}},
}}

// TestOverlappingPicksRefused: the selection page of both v1alpha2 flows
// that reach it (the released CLI's browser flow and the poll flow) shows
// a resource once where it can and marks offers that overlap; a POST that
// picks two offers of one resource anyway (made by hand: the page no
// longer lists one of them) is refused with 422 and the reason on the
// page, whatever the order, nothing provisioned and nothing sent to the
// CLI; the session stays pending and a selection without the overlap
// binds.
func TestOverlappingPicksRefused(t *testing.T) {
	e := newEnvWith(t, envOptions{offers: &overlapOffers})

	t.Run("browser flow", func(t *testing.T) {
		c := e.client()
		q := url.Values{"session_id": {"CLISESSION234567"}, "redirect_url": {cliCallback}, "consumer_id": {"9a7d-uid"}}
		sel := e.loginAt(c, "/?"+q.Encode()).Header.Get("Location")
		sid, _ := url.ParseQuery(strings.TrimPrefix(sel, "/bind?"))
		form := selectionPage(t, e, c, sel, sid.Get("s"))

		// Refused in either order, named in the order picked.
		for picked, reason := range map[string]string{
			"widgets widgets.example.com":                     "widgets and widgets.example.com both bind widgets.example.com: pick only one of them.",
			"widgets.example.com gadgets.example.com widgets": "widgets.example.com and widgets both bind widgets.example.com: pick only one of them.",
		} {
			form[web.FieldAPI] = strings.Fields(picked)
			resp, page := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
			wantRefused(t, e, 0, form[web.FieldAPI], resp, page, reason)
		}
		form[web.FieldAPI] = []string{"gadgets-with-secrets", "gadgets.example.com"}
		resp, page := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
		wantRefused(t, e, 0, form[web.FieldAPI], resp, page, "gadgets-with-secrets and gadgets.example.com both bind gadgets.example.com")

		form[web.FieldAPI] = []string{"widgets", "gadgets-with-secrets"}
		resp, page = e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("binding_response") == "" {
			t.Fatalf("bind without the overlap: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), page)
		}
		if calls := e.prov.Take(); len(calls) != 1 || len(calls[0].Resources) != 2 {
			t.Errorf("bind without the overlap provisioned %+v, want once, both resources", calls)
		}
	})

	t.Run("poll flow", func(t *testing.T) {
		resp, body := e.do(e.client(), "POST", "/api/sessions", nil)
		var ps v1alpha1.PollSession
		if resp.StatusCode != http.StatusCreated || json.Unmarshal([]byte(body), &ps) != nil {
			t.Fatalf("POST /api/sessions: %d %s", resp.StatusCode, body)
		}
		u, _ := url.Parse(e.srv.URL + "/authorize")
		signed, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := e.client()
		sel := e.loginAt(c, strings.TrimPrefix(signed.String(), e.srv.URL)).Header.Get("Location")
		form := selectionPage(t, e, c, sel, ps.SessionID)
		form[web.FieldAPI] = []string{"widgets.example.com", "widgets"}
		resp, page := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
		wantRefused(t, e, 1, form[web.FieldAPI], resp, page, "widgets.example.com and widgets both bind widgets.example.com")
		if o, err := e.store.Outcome(context.Background(), ps.SessionID); err != nil || o.State != sessions.StatePending {
			t.Errorf("the poll session after the refusal: %+v %v, want pending (its user picks again)", o, err)
		}
	})
}

// selectionPage opens the selection page sel of session sid, checks what
// it shows, and returns the form its Bind button posts (no API ticked).
func selectionPage(t *testing.T, e *env, c *http.Client, sel, sid string) url.Values {
	t.Helper()
	resp, page := e.do(c, "GET", sel, nil)
	m := csrfRE.FindStringSubmatch(page)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("selection page: %d %s", resp.StatusCode, page)
	}
	for value, want := range map[string]int{"widgets": 1, "widgets.example.com": 0, "gadgets.example.com": 1, "gadgets-with-secrets": 1} {
		if got := strings.Count(page, `name="`+web.FieldAPI+`" value="`+value+`"`); got != want {
			t.Errorf("the page lists %s %d times, want %d", value, got, want)
		}
	}
	for _, warn := range []string{
		"Binds an API that gadgets-with-secrets also binds: pick only one of them.",
		"Binds an API that gadgets.example.com also binds: pick only one of them.",
	} {
		if !strings.Contains(page, warn) {
			t.Errorf("the page does not say %q", warn)
		}
	}
	if strings.Contains(page, "Binds an API that widgets") {
		t.Error("the page marks widgets as overlapping, though it shows one offer of it")
	}
	return url.Values{web.FieldCSRF: {m[1]}, "s": {sid}, web.FieldAction: {web.ActionBind}, web.FieldConfirm: {web.ConfirmYes}}
}

// wantRefused checks that the POST of picked was refused on the page,
// with 422 and reason, and that nothing was provisioned or sent on (the
// deliveries marked are still marked).
func wantRefused(t *testing.T, e *env, marked int, picked []string, resp *http.Response, page, reason string) {
	t.Helper()
	if resp.StatusCode != http.StatusUnprocessableEntity || resp.Header.Get("Location") != "" ||
		!strings.Contains(page, `role="alert" id="form-error">`+strings.ReplaceAll(reason, "'", "&#39;")) {
		t.Errorf("POST of %q: %d %q, want 422 with %q on the page:\n%s", picked, resp.StatusCode, resp.Header.Get("Location"), reason, page)
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("POST of %q provisioned %+v", picked, calls)
	}
	if m := e.prov.Marked(); len(m) != marked {
		t.Errorf("POST of %q marked deliveries: %v, want %d as before", picked, m, marked)
	}
}

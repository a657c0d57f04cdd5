package web

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kbprovider/backend/internal/testutil/chromium"
)

func eval[T any](t *testing.T, b *chromium.Browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

var sampleAPIs = []API{
	{Group: "mangodb.com", Resource: "mangodbs", Scope: "Namespaced", Versions: []string{"v1", "v1beta1"},
		Description: "Managed MangoDB databases with backups."},
	{Group: "mangodb.com", Resource: "mangodbbackups", Scope: "Namespaced", Versions: []string{"v1"}},
	{Group: "storage.example.org", Resource: "objectbuckets", Scope: "Cluster", Versions: []string{"v1alpha1"}},
}

func TestRenderSafeAndComplete(t *testing.T) {
	rec := httptest.NewRecorder()
	RenderSelect(rec, SelectPage{
		ProviderName: `Mango<script>alert(1)</script>`,
		User:         `"alice" <alice@example.com>`,
		Action:       "/bind",
		CSRFToken:    `tok"en`,
		Hidden:       []Field{{Name: "s", Value: "sess-1"}},
		APIs:         sampleAPIs,
	})
	body := rec.Body.String()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, headers %v", rec.Code, rec.Header())
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, "Mango&lt;script&gt;") {
		t.Error("provider name not escaped")
	}
	for _, want := range []string{
		`<html lang="en">`,
		`name="csrf_token" value="tok&#34;en"`,
		`name="s" value="sess-1"`,
		`name="api" value="mangodbs.mangodb.com"`,
		`name="api" value="objectbuckets.storage.example.org"`,
		`<label class="api" for="api-0">`, `id="api-0"`,
		`value="bind"`, `value="cancel"`,
		"<style>" + styleCSS + "</style>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// The CSP admits exactly the inlined stylesheet and nothing else.
	sum := sha256.Sum256([]byte(styleCSS))
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "style-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") || !strings.HasPrefix(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if rec.Header().Get("X-Frame-Options") != "DENY" || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Error("page may be framed")
	}

	rec = httptest.NewRecorder()
	RenderError(rec, http.StatusGone, ErrorPage{Title: "This link has expired", Message: "m <b>", Hint: "Run the bind command again to get a new link."})
	if rec.Code != http.StatusGone || !strings.Contains(rec.Body.String(), "m &lt;b&gt;") || !strings.Contains(rec.Body.String(), "Run the bind command again") {
		t.Errorf("error page: %d %s", rec.Code, rec.Body.String())
	}

	rec = httptest.NewRecorder()
	RenderSelect(rec, SelectPage{Action: "/bind"})
	if !strings.Contains(rec.Body.String(), "offers no APIs") || !strings.Contains(rec.Body.String(), `value="bind" disabled`) {
		t.Error("empty selection page does not say so or lets Bind be pressed")
	}
}

// TestPagesInChromium renders every page in a real chromium, wide and on a
// phone, saves screenshots, and submits the selection form as a user would.
func TestPagesInChromium(t *testing.T) {
	var mu sync.Mutex
	var posted url.Values
	selectPage := SelectPage{
		ProviderName: "MangoDB Inc.",
		User:         "alice@example.com",
		Action:       "/bind",
		CSRFToken:    "csrf-123",
		Hidden:       []Field{{Name: "s", Value: "sess-1"}},
		APIs:         sampleAPIs,
		Origin:       Origin{ConfirmationCode: "IZ5L-N2QI"},
		Binding:      BindingInfo{Existing: true, Since: time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /select-callback", func(w http.ResponseWriter, r *http.Request) {
		p := selectPage
		p.Origin = Origin{CallbackURL: "http://localhost:43210/callback"}
		p.Binding = BindingInfo{Replaced: true}
		RenderSelect(w, p)
	})
	mux.HandleFunc("GET /select", func(w http.ResponseWriter, r *http.Request) { RenderSelect(w, selectPage) })
	mux.HandleFunc("GET /select-again", func(w http.ResponseWriter, r *http.Request) {
		p := selectPage
		p.APIs = slices.Clone(sampleAPIs)
		p.APIs[2].Checked = true
		p.Error = "Pick at least one API to bind."
		RenderSelect(w, p)
	})
	mux.HandleFunc("GET /select-empty", func(w http.ResponseWriter, r *http.Request) {
		RenderSelect(w, SelectPage{ProviderName: "MangoDB Inc.", Action: "/bind", CSRFToken: "x"})
	})
	mux.HandleFunc("POST /bind", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			t.Error(err)
		}
		mu.Lock()
		posted = r.PostForm
		mu.Unlock()
		if r.PostForm.Get(FieldAction) == ActionCancel {
			RenderCancelled(w, CancelledPage{ProviderName: "MangoDB Inc."})
			return
		}
		RenderDone(w, DonePage{ProviderName: "MangoDB Inc.", APIs: r.PostForm[FieldAPI]})
	})
	mux.HandleFunc("GET /error", func(w http.ResponseWriter, r *http.Request) {
		RenderError(w, http.StatusGone, ErrorPage{
			ProviderName: "MangoDB Inc.",
			Title:        "This link has expired",
			Message:      "The binding session behind this link ended before you finished signing in.",
			Hint:         "Run the bind command again to get a new link, then open it within 10 minutes.",
		})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	b := chromium.New(t)
	for _, size := range []struct {
		name          string
		width, height int
	}{{"wide", 1280, 900}, {"phone", 390, 844}} {
		b.Resize(size.width, size.height)
		for _, path := range []string{"/select", "/select-again", "/select-empty", "/select-callback", "/error"} {
			b.AutoScreenshot = false
			status := b.Open(srv.URL + path)
			b.Screenshot(size.name + path)
			b.AutoScreenshot = true
			wantStatus := http.StatusOK
			if path == "/error" {
				wantStatus = http.StatusGone
			}
			if status != wantStatus {
				t.Errorf("%s: status %d", path, status)
			}
			// The inlined stylesheet applied despite the strict CSP; no
			// horizontal scrolling, also on a phone.
			styled := eval[bool](t, b, `getComputedStyle(document.documentElement).backgroundColor === "rgb(243, 244, 246)"`)
			fits := eval[bool](t, b, `document.documentElement.scrollWidth <= window.innerWidth`)
			if !styled {
				t.Errorf("%s (%s): stylesheet not applied", path, size.name)
			}
			if !fits {
				t.Errorf("%s (%s): page wider than the window", path, size.name)
			}
		}
	}

	// Accessibility basics on the selection page.
	b.Resize(1280, 900)
	b.AutoScreenshot = false
	b.Open(srv.URL + "/select")
	unlabelled := eval[int](t, b, `[...document.querySelectorAll("input:not([type=hidden])")].filter(e => e.labels.length === 0).length`)
	lang := eval[string](t, b, `document.documentElement.lang`)
	if unlabelled != 0 || lang != "en" {
		t.Errorf("%d inputs without a label; lang %q", unlabelled, lang)
	}
	// Keyboard focus is visible: Tab to the first checkbox.
	b.Run(chromedp.KeyEvent("\t"))
	outline := eval[string](t, b, `(e => e.id + " " + getComputedStyle(e).outlineStyle + " " + getComputedStyle(e).outlineWidth)(document.activeElement)`)
	if outline != "api-0 solid 3px" {
		t.Errorf("focused element and outline: %q, want the first checkbox with a 3px outline", outline)
	}
	b.Screenshot("wide-select-focus")

	// The page shows the code to compare and what the bind does.
	if code := b.Text("#confirmation-code"); code != "IZ5L-N2QI" {
		t.Errorf("confirmation code %q", code)
	}
	if kind := b.Text("#binding-kind"); !strings.Contains(kind, "updates your existing binding, made on 1 March 2026, 09:30 UTC") {
		t.Errorf("binding kind %q", kind)
	}

	// A user ticks two APIs by clicking their labels' text; Bind is not
	// possible (HTML validation, no script) until the confirmation box is
	// ticked too.
	b.AutoScreenshot = true
	b.Click(`label[for="api-0"] .api-name`)
	b.Click(`label[for="api-2"] .api-group`)
	if eval[bool](t, b, `document.querySelector("form").checkValidity()`) {
		t.Error("the form may be submitted without the confirmation box")
	}
	b.Click(`label[for="confirm"] span`)
	if !eval[bool](t, b, `document.querySelector("form").checkValidity()`) {
		t.Error("the form is invalid with the confirmation box ticked")
	}
	if status := b.Submit(`button[value="bind"]`); status != http.StatusOK {
		t.Fatalf("bind: status %d", status)
	}
	mu.Lock()
	got := posted
	mu.Unlock()
	if got.Get(FieldCSRF) != "csrf-123" || got.Get("s") != "sess-1" || got.Get(FieldAction) != ActionBind || got.Get(FieldConfirm) != ConfirmYes ||
		!slices.Equal(got[FieldAPI], []string{"mangodbs.mangodb.com", "objectbuckets.storage.example.org"}) {
		t.Fatalf("posted form = %v", got)
	}
	if h := b.Text("h1"); !strings.Contains(h, "go back to your terminal") {
		t.Errorf("done page heading %q", h)
	}
	b.Resize(390, 844)
	b.Screenshot("phone-done")

	// The callback flow's page names where the result goes instead of a
	// code, and says why a presented cluster is not updated.
	b.AutoScreenshot = false
	b.Open(srv.URL + "/select-callback")
	if got := b.Text("#callback-url"); got != "http://localhost:43210/callback" || b.Exists("#confirmation-code") {
		t.Errorf("callback page: target %q, code shown %v", got, b.Exists("#confirmation-code"))
	}
	if kind := b.Text("#binding-kind"); !strings.Contains(kind, "creates a new binding") || !strings.Contains(kind, "could not prove") {
		t.Errorf("binding kind %q", kind)
	}

	// Cancel posts the form with action=cancel, whatever is ticked, and
	// without the confirmation box.
	b.Resize(1280, 900)
	b.AutoScreenshot = false
	b.Open(srv.URL + "/select")
	b.AutoScreenshot = true
	if status := b.Submit(`button[value="cancel"]`); status != http.StatusOK {
		t.Fatalf("cancel: status %d", status)
	}
	mu.Lock()
	got = posted
	mu.Unlock()
	if got.Get(FieldAction) != ActionCancel || got.Get(FieldCSRF) != "csrf-123" {
		t.Fatalf("posted form on cancel = %v", got)
	}
	if h := b.Text("h1"); h != "Binding cancelled" {
		t.Errorf("cancel page heading %q", h)
	}
	b.Resize(390, 844)
	b.Screenshot("phone-cancelled")
}

func BenchmarkRenderSelect(b *testing.B) {
	p := SelectPage{ProviderName: "MangoDB Inc.", Action: "/bind", CSRFToken: "csrf", APIs: sampleAPIs}
	b.ReportAllocs()
	for b.Loop() {
		RenderSelect(httptest.NewRecorder(), p)
	}
}

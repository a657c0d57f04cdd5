// Package web renders the backend's browser pages: the API selection page,
// the done page and error pages. Server-rendered html/template pages with
// one inlined stylesheet, no JavaScript, no external resources.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Form field names of the selection page, for the handler of its POST.
const (
	FieldCSRF    = "csrf_token" // the CSRF token given in SelectPage.CSRFToken
	FieldAPI     = "api"        // one value per ticked API: its API.ID
	FieldAction  = "action"     // ActionBind or ActionCancel: the button pressed
	ActionBind   = "bind"
	ActionCancel = "cancel"
	// FieldConfirm is the checkbox by which the user confirms that the
	// page belongs to the binding they started; ConfirmYes its value.
	FieldConfirm = "confirm"
	ConfirmYes   = "yes"
)

// API is one bindable API as the selection page lists it.
type API struct {
	// ID is the checkbox value posted back; default "<resource>.<group>".
	ID          string
	Group       string
	Resource    string
	Scope       string // "Namespaced" or "Cluster"
	Versions    []string
	Description string // optional
	Warning     string // optional caution shown with the API, e.g. that its status is not synced back
	Checked     bool   // ticked when the page is shown (e.g. shown again after an error)
}

// Field is a hidden form field the caller wants posted back.
type Field struct{ Name, Value string }

// SelectPage is the API selection page.
type SelectPage struct {
	ProviderName string
	User         string // shown as "Signed in as …"; optional
	Action       string // the form's POST URL
	CSRFToken    string
	Hidden       []Field
	APIs         []API
	Error        string // shown above the list, e.g. "Pick at least one API."
	Origin       Origin
	Binding      BindingInfo
}

// Origin is what the user checks against what they started.
type Origin struct {
	// ConfirmationCode (poll flow) is the code the client printed next to
	// the link, e.g. "K7QF-2MXA".
	ConfirmationCode string
	// CallbackURL (callback flow, released CLIs print no code) is the
	// address on the user's machine that receives the result.
	CallbackURL string
	// Pickup (kbind v2's browser flow): the user began on the provider's
	// page, and the result is picked up from the done page.
	Pickup bool
}

// BindingInfo says what the bind does to the user's bindings.
type BindingInfo struct {
	// Existing: the bind updates a binding made at Since; else it creates one.
	Existing bool
	Since    time.Time
	// Replaced: the link named an existing cluster without proving it, so
	// the bind creates a new binding instead of updating that cluster's.
	Replaced bool
	// Unknown: the provider could not tell (its cluster did not answer).
	Unknown bool
}

// DonePage is the page after a successful bind.
type DonePage struct {
	ProviderName string
	APIs         []string // what was bound, e.g. "mangodbs.mangodb.com"
	// PickupURL (kbind v2) is the single-use URL of the bundle, valid
	// until PickupUntil.
	PickupURL   string
	PickupUntil time.Time
}

// ErrorPage says what happened and what to do next.
type ErrorPage struct {
	ProviderName string
	Title        string // e.g. "This link has expired"
	Message      string // what happened, in words
	Hint         string // what to do next, e.g. "Run the bind command again to get a new link."
	// RetryURL, if set, is shown as a "Try again" link.
	RetryURL string
}

// CancelledPage is shown after the user pressed Cancel.
type CancelledPage struct {
	ProviderName string
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/style.css
var styleCSS string

var (
	pages = map[string]*template.Template{}
	// Only the inlined stylesheet is allowed: no scripts, no images from
	// anywhere, no framing. form-action is left open on purpose: the bind
	// POST of the callback flow redirects to the CLI on localhost.
	contentSecurityPolicy string
)

func init() {
	sum := sha256.Sum256([]byte(styleCSS))
	contentSecurityPolicy = "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; base-uri 'none'; frame-ancestors 'none'"
	funcs := template.FuncMap{
		"css":          func() template.CSS { return template.CSS(styleCSS) },
		"fieldCSRF":    func() string { return FieldCSRF },
		"fieldAPI":     func() string { return FieldAPI },
		"fieldAction":  func() string { return FieldAction },
		"actionBind":   func() string { return ActionBind },
		"actionCancel": func() string { return ActionCancel },
		"fieldConfirm": func() string { return FieldConfirm },
		"confirmYes":   func() string { return ConfirmYes },
		"date":         func(t time.Time) string { return t.UTC().Format("2 January 2006, 15:04 UTC") },
	}
	for _, name := range []string{"select.html", "done.html", "error.html"} {
		pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name))
	}
}

// RenderSelect writes the API selection page with status 200.
func RenderSelect(w http.ResponseWriter, p SelectPage) {
	RenderSelectStatus(w, http.StatusOK, p)
}

// RenderSelectStatus writes the API selection page with another status,
// e.g. 422 when it is shown again because the submitted choice was not
// valid.
func RenderSelectStatus(w http.ResponseWriter, status int, p SelectPage) {
	for i := range p.APIs {
		if p.APIs[i].ID == "" {
			p.APIs[i].ID = p.APIs[i].Resource + "." + p.APIs[i].Group
		}
	}
	render(w, status, "select.html", p)
}

// RenderDone writes the done page with status 200.
func RenderDone(w http.ResponseWriter, p DonePage) {
	render(w, http.StatusOK, "done.html", p)
}

// RenderError writes an error page with the given status.
func RenderError(w http.ResponseWriter, status int, p ErrorPage) {
	render(w, status, "error.html", errorData{ErrorPage: p})
}

// RenderCancelled writes the page after Cancel with status 200.
func RenderCancelled(w http.ResponseWriter, p CancelledPage) {
	render(w, http.StatusOK, "error.html", errorData{Neutral: true, ErrorPage: ErrorPage{
		ProviderName: p.ProviderName,
		Title:        "Binding cancelled",
		Message:      "Nothing was bound. The command in your terminal stops and says so.",
		Hint:         "You can close this tab. To bind later, run the bind command again.",
	}})
}

type errorData struct {
	ErrorPage
	Neutral bool
}

func render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		// Only a bug in a template gets here; never show half a page.
		slog.Error("rendering page", "page", name, "error", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

package web

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// An API's warning is shown with that API (escaped), and only with it.
func TestRenderAPIWarning(t *testing.T) {
	rec := httptest.NewRecorder()
	RenderSelect(rec, SelectPage{Action: "/bind", APIs: []API{
		{Group: "mangodb.com", Resource: "mangodbs", Scope: "Namespaced", Versions: []string{"v1"}, Warning: "No <status> synced back."},
		{Group: "cache.example.com", Resource: "redises", Scope: "Namespaced", Versions: []string{"v1"}},
	}})
	body := rec.Body.String()
	if n := strings.Count(body, `class="api-warn"`); n != 1 {
		t.Fatalf("%d warnings on the page, want 1", n)
	}
	items := strings.Split(body, "<li>")
	if len(items) != 3 || !strings.Contains(items[1], `<span class="api-warn">No &lt;status&gt; synced back.</span>`) ||
		strings.Contains(items[2], "api-warn") {
		t.Errorf("the warning is not with its API, or not escaped:\n%s", body)
	}
}

package v1alpha2

import (
	"fmt"
	"mime"
	"os"
	"strings"
	"testing"
)

// TestRouteSurface: every route of the assembled API (both generations,
// the browser part, the probes), with and without a path prefix, answers
// each method with the status, Allow and media type recorded in
// testdata/surface.txt. Requests carry no credentials, so they stop
// before anything is created; what they reach is the route table.
func TestRouteSurface(t *testing.T) {
	var got strings.Builder
	for _, prefix := range []string{"", "/kb"} {
		e := newEnvWith(t, envOptions{prefix: prefix})
		c := e.client()
		paths := []string{"/", "/healthz", "/readyz", "/nothing", PathExports, PathExportsOld, PathAuthorize, PathTemplates,
			PathCollections, PathBind, PathSessions, "/api/nothing"}
		for _, p := range []string{"/export", "/sessions", "/poll", "/authorize", "/callback", "/bind"} {
			paths = append(paths, p)
			if prefix != "" {
				paths = append(paths, prefix+p)
			}
		}
		for _, p := range paths {
			for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
				if m == "POST" && (p == prefix+"/sessions" || p == PathSessions) {
					// Creates a session (nothing else does without a
					// login): its 201 is tested elsewhere.
					continue
				}
				resp, _ := e.do(c, m, p, nil)
				media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
				fmt.Fprintf(&got, "%q %s %s %d allow=%q %s\n", prefix, m, p, resp.StatusCode, resp.Header.Get("Allow"), media)
			}
		}
	}
	const golden = "testdata/surface.txt"
	if os.Getenv("UPDATE_SURFACE") != "" {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		gl, wl := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("line %d: got %s, want %s", i+1, g, w)
			}
		}
	}
}

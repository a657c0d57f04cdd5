package chromium

import (
	"bytes"
	"fmt"
	"html"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// formServer serves a form and the page its POST leads to, like the
// backend's pages: no JavaScript needed.
func formServer(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>Form</title>
<style>body{font-family:sans-serif;margin:2rem} label{display:block;margin:.5rem 0}</style></head>
<body><h1>Say hello</h1>
<form method="post" action="/greet" id="greet">
<label>Name <input name="name" id="name" required></label>
<label>Colour <select name="colour" id="colour"><option>red</option><option>green</option><option>blue</option></select></label>
<label><input type="checkbox" name="loud" id="loud"> loud</label>
<button type="submit" id="go">Greet</button>
</form></body></html>`)
	})
	mux.HandleFunc("POST /greet", func(w http.ResponseWriter, r *http.Request) {
		greeting := fmt.Sprintf("Hello, %s! You like %s.", r.PostFormValue("name"), r.PostFormValue("colour"))
		if r.PostFormValue("loud") == "on" {
			greeting = strings.ToUpper(greeting)
		}
		fmt.Fprintf(w, `<!doctype html><html><head><title>Greeting</title></head>
<body><p id="result">%s</p><a id="again" href="/">again</a></body></html>`, html.EscapeString(greeting))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestFormRoundTripWithScreenshots(t *testing.T) {
	srv := formServer(t)
	b := New(t)

	if status := b.Open(srv.URL + "/"); status != http.StatusOK {
		t.Fatalf("open: status %d", status)
	}
	if got := b.Text("h1"); got != "Say hello" {
		t.Errorf("h1 = %q", got)
	}
	b.Fill("#name", "Ada <Lovelace>")
	b.Fill("#colour", "green")
	b.Click("#loud") // a click that does not navigate
	if status := b.Submit("#go"); status != http.StatusOK {
		t.Fatalf("submit: status %d", status)
	}
	if got, want := b.Text("#result"), "HELLO, ADA <LOVELACE>! YOU LIKE GREEN."; got != want {
		t.Errorf("result = %q, want %q", got, want)
	}
	if !strings.HasSuffix(b.URL(), "/greet") {
		t.Errorf("URL after submit = %s, want …/greet", b.URL())
	}
	if h := b.HTML(); !strings.Contains(h, "&lt;LOVELACE&gt;") {
		t.Errorf("HTML does not hold the escaped name: %s", h)
	}

	// A link, then the form submitted through a field (like pressing Enter);
	// Fill replaces what the field held.
	if status := b.ClickAndWait("#again"); status != http.StatusOK {
		t.Fatalf("click again: status %d", status)
	}
	b.Fill("#name", "first")
	b.Fill("#name", "Grace")
	b.Submit("#name")
	if got, want := b.Text("#result"), "Hello, Grace! You like red."; got != want {
		t.Errorf("result = %q, want %q", got, want)
	}
	if b.Exists("#name") || !b.Exists("#again") {
		t.Error("Exists does not match the result page")
	}

	if status := b.Open(srv.URL + "/missing"); status != http.StatusNotFound {
		t.Errorf("open /missing: status %d, want 404", status)
	}

	b.Resize(390, 844)
	b.Open(srv.URL + "/")
	path := b.Screenshot("phone")

	// Every page load left a screenshot: /, /greet, /, /greet, /missing, /
	// and the explicit one; each is a real PNG with the page's size.
	shots, _ := filepath.Glob(filepath.Join(b.ArtifactDir(), "*.png"))
	if len(shots) != 7 {
		t.Errorf("screenshots %v, want 7", shots)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w != 390 {
		t.Errorf("phone screenshot is %d px wide, want 390", w)
	}
}

// Without chromium the test fails (never skips), naming the install script.
func TestMissingChromiumFailsNamingTheScript(t *testing.T) {
	if os.Getenv("BROWSER_TEST_CHILD") != "" {
		New(t)
		t.Fatal("New returned without chromium")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChromiumFailsNamingTheScript$", "-test.v")
	cmd.Env = append(os.Environ(), "BROWSER_TEST_CHILD=1", ExecPathEnv+"=/nonexistent/chromium")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), InstallScript) || strings.Contains(string(out), "SKIP") {
		t.Errorf("child without chromium: err=%v, want a failure naming %s; output:\n%s", err, InstallScript, out)
	}
}

// Chromium's own temporary folders (the profile's SingletonSocket) are in
// the test's temporary folder, which goes with the test, and not in /tmp,
// where a killed chromium leaves them.
func TestTemporaryFoldersAreTheTests(t *testing.T) {
	b := New(t)
	socket, err := os.Readlink(filepath.Join(b.userData, "SingletonSocket"))
	if err != nil {
		t.Fatalf("the profile's SingletonSocket: %v", err)
	}
	if !strings.HasPrefix(socket, b.tmp+string(filepath.Separator)) {
		t.Errorf("chromium's SingletonSocket is %s, want it in the test's folder %s", socket, b.tmp)
	}
}

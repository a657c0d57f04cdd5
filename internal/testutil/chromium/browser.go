// Package chromium drives Debian's chromium (headless) from tests with
// chromedp: open a page, fill and submit forms, click, read the page, and
// save a full-page PNG screenshot of every page as a test artefact.
//
// Every method fails the test on error (t.Fatalf), like a user who cannot go
// on; Run gives raw chromedp access for anything else.
package chromium

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// ExecPathEnv overrides the chromium binary (default /usr/bin/chromium).
const ExecPathEnv = "KUBE_BIND_TEST_CHROMIUM"

// ArtifactsEnv names the folder for artefacts; screenshots of a test go to
// $KUBE_BIND_TEST_ARTIFACTS/<TestName>/, else to _artifacts/<TestName>/ under
// the repository root.
const ArtifactsEnv = "KUBE_BIND_TEST_ARTIFACTS"

// InstallScript installs chromium.
const InstallScript = "hack/install-test-deps.sh"

// DefaultTimeout bounds each step (a page load, finding an element).
const DefaultTimeout = 30 * time.Second

// Browser is one headless chromium with one tab, for one test.
type Browser struct {
	t       testing.TB
	ctx     context.Context
	dir     string
	timeout time.Duration
	// userData is the profile's folder; tmp is chromium's TMPDIR.
	userData, tmp string
	// started is set once the browser answered its first action.
	started bool
	// stop ends the tab and the browser.
	stop func()

	// AutoScreenshot saves a screenshot after every page load (Open,
	// Submit, ClickAndWait). On by default.
	AutoScreenshot bool

	mu      sync.Mutex
	shots   int
	console []string
}

// New starts chromium for the test and closes it when the test ends. It fails
// the test, naming hack/install-test-deps.sh, if chromium is not installed.
func New(t testing.TB) *Browser {
	t.Helper()
	if err := procs.RefuseInParallelSet("chromium"); err != nil {
		t.Fatal(err)
	}
	execPath := os.Getenv(ExecPathEnv)
	if execPath == "" {
		execPath = "/usr/bin/chromium"
	}
	if _, err := exec.LookPath(execPath); err != nil {
		t.Fatalf("browser: chromium not found at %s (%v): run %s (installs Debian's chromium)", execPath, err, InstallScript)
	}

	b := &Browser{t: t, timeout: DefaultTimeout, AutoScreenshot: true}
	// A chromium that exits before it answers (seen on a loaded machine)
	// is started again, with a new profile: the tests are about the
	// pages, not about chromium's start.
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = b.start(execPath); err == nil {
			break
		}
		t.Logf("browser: start %d of %d: %v", attempt, startAttempts, err)
	}
	if err != nil {
		t.Fatalf("browser: start %s: %v (if it is missing or broken, run %s)", execPath, err, InstallScript)
	}
	ctx := b.ctx
	t.Cleanup(func() {
		b.screenshotOnFailure()
		b.stop()
	})
	consoleCalls := chromedp.Events(ctx, runtime.ConsoleAPICalled)
	exceptions := chromedp.Events(ctx, runtime.ExceptionThrown)
	go func() {
		for ev, err := range consoleCalls {
			if err != nil {
				return
			}
			var parts []string
			for _, a := range ev.Args {
				if a.Value != nil {
					parts = append(parts, string(a.Value))
				} else {
					parts = append(parts, a.Description)
				}
			}
			b.addConsole(fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(parts, " ")))
		}
	}()
	go func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			b.addConsole("exception: " + ev.ExceptionDetails.Text + exceptionDescription(ev.ExceptionDetails))
		}
	}()

	b.dir = artifactDir(t)
	t.Logf("browser: screenshots in %s", b.dir)
	return b
}

// startAttempts is how many times New starts chromium before it fails.
const startAttempts = 3

// start starts chromium with a new profile and TMPDIR and waits, within
// b.timeout, for its first answer; on failure nothing of it is left
// running.
func (b *Browser) start(execPath string) error {
	b.userData = b.t.TempDir()
	// Chromium makes folders of its own in TMPDIR (the profile's
	// SingletonSocket), which it leaves when killed, as the end of a
	// test does: so its TMPDIR is one the test removes. Not t.TempDir:
	// that path holds the test's name, and a socket's path must stay
	// under 108 bytes, or chromium exits at start.
	tmp, err := os.MkdirTemp("", "chromium-")
	if err != nil {
		return err
	}
	b.t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	b.tmp = tmp
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(execPath),
		chromedp.UserDataDir(b.userData),
		chromedp.Env("TMPDIR="+b.tmp),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root, where the sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// Without these, chromium keeps trying to reach Google's services,
		// which this closed network refuses.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints"),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("use-mock-keychain", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	b.ctx = ctx
	b.stop = func() {
		cancelTab()
		cancelAlloc()
	}
	// The start comes first and alone: any chromedp call on a context
	// without a browser starts one, so a call after a start that failed
	// would start a second browser on the same context, whose allocator
	// then panics (a channel closed twice). The browser lives as long as
	// the context of the call that started it, so that call has no
	// deadline; the wait for it has.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx, chromedp.Navigate("about:blank")) }()
	select {
	case err = <-started:
	case <-time.After(b.timeout):
		b.stop()
		<-started
		err = fmt.Errorf("no answer within %s", b.timeout)
	}
	if err != nil {
		b.stop()
		return err
	}
	b.started = true
	return nil
}

// screenshotOnFailure keeps the page and the console of a failed test.
// Only a browser that started can be asked for anything.
func (b *Browser) screenshotOnFailure() {
	if !b.t.Failed() || !b.started {
		return
	}
	b.screenshotQuiet("failed")
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.console) > 0 {
		b.t.Logf("browser console:\n  %s", strings.Join(b.console, "\n  "))
	}
}

func exceptionDescription(d *runtime.ExceptionDetails) string {
	if d != nil && d.Exception != nil && d.Exception.Description != "" {
		return " " + d.Exception.Description
	}
	return ""
}

func (b *Browser) addConsole(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.console) < 200 {
		b.console = append(b.console, line)
	}
}

// ArtifactDir is the folder of this test's screenshots.
func (b *Browser) ArtifactDir() string { return b.dir }

// Context is the chromedp context of the browser's tab, for chromedp calls
// beyond this package's helpers.
func (b *Browser) Context() context.Context { return b.ctx }

// SetTimeout changes how long each step may take.
func (b *Browser) SetTimeout(d time.Duration) { b.timeout = d }

// Open loads url, waits for the page, saves a screenshot and returns the
// HTTP status of the document (after redirects).
func (b *Browser) Open(url string) int {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(url))
	if err != nil {
		b.fatalf("open %s: %v", url, err)
	}
	b.afterLoad()
	return statusOf(resp.Status)
}

// Fill types value into the input or textarea that the CSS selector finds
// (after clearing it), or selects value in a select element.
func (b *Browser) Fill(selector, value string) {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	// Clear the field (or pick the option) in the page, then type like a
	// user for text fields.
	isSelect, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(e => {
  if (!e) throw new Error("no element");
  if (e.tagName === "SELECT") {
    e.value = %s;
    if (e.value !== %s) throw new Error("no such option");
  } else {
    e.value = "";
  }
  e.dispatchEvent(new Event("input", {bubbles: true}));
  e.dispatchEvent(new Event("change", {bubbles: true}));
  return e.tagName === "SELECT";
})(document.querySelector(%s))`, jsString(value), jsString(value), jsString(selector))))
	if err == nil && !isSelect {
		err = chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(selector), value, chromedp.NodeVisible))
	}
	if err != nil {
		b.fatalf("fill %s: %v", selector, err)
	}
}

// Click clicks the element the CSS selector finds, with a real mouse event,
// and does not wait for a page load: use ClickAndWait for links and buttons
// that lead to another page.
func (b *Browser) Click(selector string) {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible)); err != nil {
		b.fatalf("click %s: %v", selector, err)
	}
}

// ClickAndWait clicks the element (a link, a submit button) and waits for the
// page it leads to; it saves a screenshot and returns the document's HTTP
// status.
func (b *Browser) ClickAndWait(selector string) int {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible))
	if err != nil {
		b.fatalf("click %s and wait for the next page: %v", selector, err)
	}
	b.afterLoad()
	return statusOf(resp.Status)
}

// Submit submits a form and waits for the page it leads to: selector is a
// submit button (clicked, as a user would) or the form itself or a field in
// it (submitted with requestSubmit, which runs validation like Enter does).
// It saves a screenshot and returns the document's HTTP status.
func (b *Browser) Submit(selector string) int {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	isButton, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`(e => !!e && (e.type === "submit" || e.type === "image"))(document.querySelector(%s))`, jsString(selector))))
	if err != nil {
		b.fatalf("submit %s: %v", selector, err)
	}
	action := chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible)
	if !isButton {
		action = chromedp.Evaluate[chromedp.Void](fmt.Sprintf(
			`(e => { const f = e.tagName === "FORM" ? e : (e.form || e.closest("form")); if (!f) throw new Error("no form around %s"); f.requestSubmit(); })(document.querySelector(%s))`,
			strings.ReplaceAll(selector, `"`, `'`), jsString(selector)))
	}
	resp, err := chromedp.RunResponse(ctx, chromedp.WaitReady(chromedp.CSS(selector)), action)
	if err != nil {
		b.fatalf("submit %s: %v", selector, err)
	}
	b.afterLoad()
	return statusOf(resp.Status)
}

// Text returns the visible text of the element the CSS selector finds,
// waiting for it to appear.
func (b *Browser) Text(selector string) string {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(selector), chromedp.NodeVisible))
	if err != nil {
		b.fatalf("text of %s: %v", selector, err)
	}
	return s
}

// Exists reports whether the CSS selector finds an element now, without
// waiting.
func (b *Browser) Exists(selector string) bool {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%s) !== null`, jsString(selector))))
	if err != nil {
		b.fatalf("look for %s: %v", selector, err)
	}
	return ok
}

// HTML returns the page's current HTML.
func (b *Browser) HTML() string {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		b.fatalf("read the page's HTML: %v", err)
	}
	return s
}

// URL returns the address of the current page.
func (b *Browser) URL() string {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		b.fatalf("read the page's URL: %v", err)
	}
	return s
}

// Resize changes the viewport, e.g. Resize(390, 844) to see the page as on
// a phone.
func (b *Browser) Resize(width, height int) {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		b.fatalf("resize to %dx%d: %v", width, height, err)
	}
}

// Run runs chromedp actions in the browser's tab, with the step timeout.
func (b *Browser) Run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fatalf("run: %v", err)
	}
}

// Screenshot saves a full-page PNG named NN-<name>.png in the artefact
// folder and returns its path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	path, err := b.screenshot(name)
	if err != nil {
		b.t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	return path
}

func (b *Browser) screenshot(name string) (string, error) {
	b.t.Helper()
	ctx, cancel := b.stepCtx()
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	b.shots++
	n := b.shots
	b.mu.Unlock()
	path := filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", n, sanitize(name)))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return "", err
	}
	b.t.Logf("browser: screenshot %s", path)
	return path, nil
}

func (b *Browser) screenshotQuiet(name string) {
	b.t.Helper()
	if _, err := b.screenshot(name); err != nil {
		b.t.Logf("browser: screenshot %s: %v", name, err)
	}
}

// afterLoad names the automatic screenshot after the page's path.
func (b *Browser) afterLoad() {
	b.t.Helper()
	if !b.AutoScreenshot {
		return
	}
	ctx, cancel := b.stepCtx()
	defer cancel()
	loc, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.pathname`))
	if err != nil || loc == "" || loc == "/" {
		loc = "index"
	}
	b.screenshotQuiet(loc)
}

func (b *Browser) stepCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.ctx, b.timeout)
}

func (b *Browser) fatalf(format string, args ...any) {
	b.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if url, err := chromedp.Run(b.ctx, chromedp.Location()); err == nil {
		msg += " (page: " + url + ")"
	}
	b.t.Fatalf("browser: %s", msg)
}

func statusOf(s int64) int { return int(s) }

func jsString(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func sanitize(s string) string {
	s = strings.Trim(unsafeChars.ReplaceAllString(s, "-"), "-.")
	if s == "" {
		s = "page"
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// artifactDir makes (and empties of old screenshots) the test's folder.
func artifactDir(t testing.TB) string {
	t.Helper()
	base := os.Getenv(ArtifactsEnv)
	if base == "" {
		base = filepath.Join(procs.RepoRoot(), "_artifacts")
	}
	dir := filepath.Join(base, sanitize(strings.ReplaceAll(t.Name(), "/", "__")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("browser: artefact folder: %v", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	for _, f := range old {
		_ = os.Remove(f)
	}
	return dir
}

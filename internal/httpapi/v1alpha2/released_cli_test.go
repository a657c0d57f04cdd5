package v1alpha2

import (
	"bufio"
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/konnector"
)

// TestReleasedCLILogin runs the released kubectl-bind v0.8.2 against the v1alpha2 routes: `login`
// stores the token this backend minted (the test plays the browser), and
// `templates` lists the offers with it. The full flows with a real
// identity provider and clusters are in the e2e tests.
func TestReleasedCLILogin(t *testing.T) {
	bin := konnector.ReleasedBinaryOf(t, konnector.ReleasedV1alpha2, "kubectl-bind")
	e := newEnv(t)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "config")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "login", e.srv.URL, "--skip-browser", "--config-file", cfgFile)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	var out bytes.Buffer
	cmd.Stdout = &out
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urlRE := regexp.MustCompile(`https?://\S+/api/authorize\?\S+`)
	var link string
	sc := bufio.NewScanner(stderr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if m := urlRE.FindString(sc.Text()); m != "" {
			link = m
			break
		}
	}
	if link == "" {
		t.Fatalf("no login URL printed:\n%s", strings.Join(lines, "\n"))
	}
	go func() {
		for sc.Scan() {
		}
	}()
	u, _ := url.Parse(link)
	resp := e.loginAt(e.client(), u.RequestURI())
	loc := resp.Header.Get("Location")
	if !strings.HasPrefix(loc, "http://127.0.0.1:") {
		t.Fatalf("login ended at %q", loc)
	}
	// The browser follows the redirect to the CLI.
	if r, err := e.client().Get(loc); err != nil {
		t.Fatal(err)
	} else {
		r.Body.Close()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kubectl-bind login: %v\n%s", err, out.String())
	}
	stored, _ := os.ReadFile(cfgFile)
	if !strings.Contains(string(stored), "kbt1.") {
		t.Fatalf("the config holds no token:\n%s", stored)
	}
	tpl := exec.CommandContext(ctx, bin, "templates", "--config-file", cfgFile, "-o", "json")
	tpl.Env = cmd.Env
	got, err := tpl.CombinedOutput()
	if err != nil || !strings.Contains(string(got), "mangodb-with-secrets") || !strings.Contains(string(got), "widgets.example.com") {
		t.Fatalf("kubectl-bind templates: %v\n%s", err, got)
	}
}

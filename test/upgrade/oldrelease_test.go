package upgrade

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// previousRelease is the last commit before the v1alpha2 work: the
// backend a provider upgrades from.
const previousRelease = "1c85617"

// prepareMain is added to the previous release's tree as
// cmd/upgrade-prepare: it installs what that release installs in a
// provider cluster (its deploy/crds, v1alpha1 only, and its ClusterRoles)
// and the example API, through that release's own code.
const prepareMain = `// Command upgrade-prepare prepares a provider cluster as this release
// did: its kube-bind.io CRDs, its ClusterRoles, and the MangoDB example.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
)

func main() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, cfg, exampleapis.MangoDB); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

// oldRelease is the previous release, built from its commit.
type oldRelease struct {
	commit  string // full hash
	backend string // cmd/backend
	cli     string // cmd/kube-bind-poll: the client a consumer bound with
	prepare string // cmd/upgrade-prepare (prepareMain)
}

// buildOldRelease returns the previous release's binaries, building them
// once into $HOME/.cache/kube-bind-backend/backend-<commit>-<helper sum>/
// from `git archive` of the commit (the CI has the full history). The
// folder is installed by rename, so a half-built one is never used, under
// a lock, so a second caller waits instead of building again.
func buildOldRelease(t *testing.T) oldRelease {
	t.Helper()
	root := procs.RepoRoot()
	out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", previousRelease+"^{commit}").CombinedOutput()
	if err != nil {
		t.Fatalf("commit %s of the previous release is not in this clone (a full clone is needed): %v\n%s", previousRelease, err, out)
	}
	commit := strings.TrimSpace(string(out))
	sum := sha256.Sum256([]byte(prepareMain))
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	cacheRoot := filepath.Join(home, ".cache", "kube-bind-backend")
	dir := filepath.Join(cacheRoot, "backend-"+commit+"-"+hex.EncodeToString(sum[:4]))
	rel := oldRelease{commit: commit, backend: filepath.Join(dir, "backend"),
		cli: filepath.Join(dir, "kube-bind-poll"), prepare: filepath.Join(dir, "upgrade-prepare")}
	if complete(rel) {
		return rel
	}
	if err := os.MkdirAll(cacheRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if complete(rel) { // built by another caller while we waited
		return rel
	}

	start := time.Now()
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(filepath.Join(src, "cmd", "upgrade-prepare"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "cmd", "upgrade-prepare", "main.go"), []byte(prepareMain), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(cacheRoot, ".backend-build-")
	if err != nil {
		t.Fatal(err)
	}
	// Gone after the rename; a failed build's leftovers otherwise.
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp made it 0700
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", tmp+string(filepath.Separator),
		"./cmd/backend", "./cmd/kube-bind-poll", "./cmd/upgrade-prepare")
	build.Dir = src
	// No .git in an archive; no workspace of the caller's.
	build.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -buildvcs=false"), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the previous release %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatalf("installing the build: %v", err)
	}
	if !complete(rel) {
		t.Fatalf("the build of %s in %s lacks a binary", commit, dir)
	}
	t.Logf("built the previous release %s into %s in %s", commit[:12], dir, time.Since(start).Round(time.Second))
	return rel
}

func complete(r oldRelease) bool {
	for _, p := range []string{r.backend, r.cli, r.prepare} {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// runOld runs a binary of the previous release to its end.
func runOld(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return string(out)
}

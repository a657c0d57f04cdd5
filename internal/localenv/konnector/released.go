package konnector

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// The kube-bind releases whose binaries the demo and the tests run: the
// last of the v1alpha1 generation, and the newest of v1alpha2.
const (
	ReleasedVersion  = "v0.4.8"
	ReleasedV1alpha2 = "v0.8.2"
	// ReleasedV2 is the kbind v2 release (API group core.kbind.io), in
	// folder kbind-<version> beside the others, with its CRDs in crds/.
	ReleasedV2 = "v2.0.0-rc4"
)

// PeersEnv names the folder holding a folder kube-bind-<version> per
// release, each with the released binaries (konnector.gz, kubectl-bind.gz)
// and SHA256SUMS of the unzipped files. It may also name one such release
// folder, whose siblings are then the other releases. Without it the
// folders are looked for in peers/ at the repository's root (git-ignored).
const PeersEnv = "KUBE_BIND_TEST_PEERS"

var (
	releasedMu    sync.Mutex
	releasedPaths = map[string]string{}
)

// ReleasedPath is ReleasedPathOf the v1alpha1 release.
func ReleasedPath(name string) (string, error) { return ReleasedPathOf(ReleasedVersion, name) }

// ReleasedPathOf returns the path of the kube-bind binary name
// ("konnector", "kubectl-bind", "backend") of release: unzipped once into
// $HOME/.cache/kube-bind-backend/kube-bind-<release>/ and checked against
// SHA256SUMS (the cached copy too, once per process), or why the release
// folder or a binary is not usable.
func ReleasedPathOf(release, name string) (string, error) {
	releasedMu.Lock()
	defer releasedMu.Unlock()
	key := release + "/" + name
	if p, ok := releasedPaths[key]; ok {
		return p, nil
	}
	src, err := peersDir(folderOf(release))
	if err != nil {
		return "", err
	}
	want, err := readSum(filepath.Join(src, "SHA256SUMS"), name)
	if err != nil {
		return "", err
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	cache := filepath.Join(home, ".cache", "kube-bind-backend", folderOf(release))
	dst := filepath.Join(cache, name)
	if got, err := fileSum(dst); err == nil && got == want {
		releasedPaths[key] = dst
		return dst, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	if err := gunzipTo(filepath.Join(src, name+".gz"), dst, want); err != nil {
		return "", err
	}
	releasedPaths[key] = dst
	return dst, nil
}

// folderOf names a release's folder: kbind-<version> for v2, else
// kube-bind-<version>.
func folderOf(release string) string {
	if release == ReleasedV2 {
		return "kbind-" + release
	}
	return "kube-bind-" + release
}

// V2Dir is the folder of the kbind v2 release: konnector.gz, SHA256SUMS
// and crds/ with the CRDs a consumer cluster needs.
func V2Dir() (string, error) { return peersDir(folderOf(ReleasedV2)) }

// peersDir finds a release's folder of binaries.
func peersDir(folder string) (string, error) {
	if d := os.Getenv(PeersEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err == nil {
			// One release's folder: the others are its siblings.
			d = filepath.Dir(d)
		}
		d = filepath.Join(d, folder)
		if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err != nil {
			return "", fmt.Errorf("%s: %w", PeersEnv, err)
		}
		return d, nil
	}
	d := filepath.Join(procs.RepoRoot(), "peers", folder)
	if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err != nil {
		return "", fmt.Errorf("no folder %s with SHA256SUMS (%w); set %s to the folder holding it", folder, err, PeersEnv)
	}
	return d, nil
}

func readSum(sumsFile, name string) (string, error) {
	f, err := os.Open(sumsFile)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 2 && strings.TrimPrefix(fields[1], "*") == name {
			return strings.ToLower(fields[0]), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s has no sum for %s", sumsFile, name)
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// gunzipTo unzips src next to dst, checks the sum, and renames it into
// place, so no half-written or wrong binary is ever at dst.
func gunzipTo(src, dst, wantSum string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), zr); err != nil {
		tmp.Close()
		return fmt.Errorf("unzipping %s: %w", src, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantSum {
		return fmt.Errorf("%s unzips to SHA-256 %s, SHA256SUMS says %s", src, got, wantSum)
	}
	return os.Rename(tmp.Name(), dst)
}

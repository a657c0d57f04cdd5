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

// ReleasedVersion is the kube-bind release whose binaries the demo and the
// tests run.
const ReleasedVersion = "v0.4.8"

// PeersEnv names the folder holding the released binaries (konnector.gz,
// kubectl-bind.gz and SHA256SUMS of the unzipped files). Without it the
// folder kube-bind-v0.4.8 is looked for in shared/peers or peers beside
// the repository or one of its parents.
const PeersEnv = "KUBE_BIND_TEST_PEERS"

var (
	releasedMu    sync.Mutex
	releasedPaths = map[string]string{}
)

// ReleasedPath returns the path of the released kube-bind binary name
// ("konnector" or "kubectl-bind"): unzipped once into
// $HOME/.cache/kube-bind-backend/kube-bind-v0.4.8/ and checked against
// SHA256SUMS (the cached copy too, once per process), or why the release
// folder or a binary is not usable.
func ReleasedPath(name string) (string, error) {
	releasedMu.Lock()
	defer releasedMu.Unlock()
	if p, ok := releasedPaths[name]; ok {
		return p, nil
	}
	src, err := peersDir()
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
	cache := filepath.Join(home, ".cache", "kube-bind-backend", "kube-bind-"+ReleasedVersion)
	dst := filepath.Join(cache, name)
	if got, err := fileSum(dst); err == nil && got == want {
		releasedPaths[name] = dst
		return dst, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	if err := gunzipTo(filepath.Join(src, name+".gz"), dst, want); err != nil {
		return "", err
	}
	releasedPaths[name] = dst
	return dst, nil
}

// peersDir finds the folder of the released binaries.
func peersDir() (string, error) {
	const folder = "kube-bind-" + ReleasedVersion
	if d := os.Getenv(PeersEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err != nil {
			return "", fmt.Errorf("%s=%s: %w", PeersEnv, d, err)
		}
		return d, nil
	}
	dir, err := filepath.Abs(procs.RepoRoot())
	if err != nil {
		return "", err
	}
	var tried []string
	for {
		for _, rel := range []string{"shared/peers", "peers"} {
			d := filepath.Join(dir, rel, folder)
			tried = append(tried, d)
			if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err == nil {
				return d, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no folder %s with SHA256SUMS found (tried %s); set %s to it",
				folder, strings.Join(tried, ", "), PeersEnv)
		}
		dir = parent
	}
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

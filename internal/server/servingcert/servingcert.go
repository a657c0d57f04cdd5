// Package servingcert serves TLS from a certificate and key on disk and picks
// up new files without a restart.
//
// cert-manager and the kubelet rotate a mounted Secret by writing a new
// timestamped directory and swapping the "..data" symlink to it, so the
// Reloader watches the directories holding the files (a watch on the file
// itself would follow the old inode) and, as a fallback for missed events
// and for filesystems without inotify, re-reads the files periodically.
// Only handshakes after a reload see the new pair; established connections
// keep the certificate they negotiated and are never closed.
package servingcert

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// defaultInterval is how often the files are re-read even without an
	// event; reading two small files is cheap.
	defaultInterval = 10 * time.Second
	// debounce lets a writer finish a burst of changes (cert, then key, then
	// the symlink swap) before the pair is read.
	debounce = 100 * time.Millisecond
	// maxFileSize bounds what is read from disk; PEM chains are a few KiB.
	maxFileSize = 1 << 20
)

// Reloader holds the current certificate and replaces it when the files on
// disk change to a new, valid pair.
type Reloader struct {
	certFile, keyFile string
	logger            *slog.Logger
	interval          time.Duration
	noWatch           bool // tests: exercise the periodic check alone

	current atomic.Pointer[tls.Certificate]

	mu         sync.Mutex // serialises reloads
	loadedHash [sha256.Size]byte
	failedHash [sha256.Size]byte // last content that failed, to log it once
}

// New loads the pair once and fails if it is not valid: a server must not
// start without a certificate.
func New(certFile, keyFile string, logger *slog.Logger) (*Reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("servingcert: both a certificate file and a key file are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{
		certFile: certFile,
		keyFile:  keyFile,
		logger:   logger.With("certFile", certFile, "keyFile", keyFile),
		interval: defaultInterval,
	}
	if _, err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// TLSConfig returns a server configuration (TLS 1.2 or newer) that presents
// the current certificate at every handshake. Use it with
// http.Server.ServeTLS(ln, "", "") so HTTP/2 is negotiated as usual.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.current.Load(), nil
		},
	}
}

// Certificate returns the pair being served now.
func (r *Reloader) Certificate() *tls.Certificate {
	return r.current.Load()
}

// Run watches for changes until ctx is done. If the file watcher cannot be
// set up it logs why and relies on the periodic check alone.
func (r *Reloader) Run(ctx context.Context) {
	var events <-chan fsnotify.Event
	var watchErrors <-chan error
	if r.noWatch {
		// periodic check only
	} else if w, err := r.watch(); err != nil {
		r.logger.Warn("cannot watch certificate directories; relying on the periodic check", "interval", r.interval, "err", err)
	} else {
		defer w.Close()
		events, watchErrors = w.Events, w.Errors
	}

	// Catch a change made between New and the watch being in place.
	r.reloadAndLog()

	ticker := time.NewTicker(r.interval)
	defer ticker.Stop()
	// A stopped timer that each event re-arms: a burst of events leads to one
	// reload shortly after the last of them.
	pending := time.NewTimer(time.Hour)
	pending.Stop()
	defer pending.Stop()

	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			pending.Reset(debounce)
		case err := <-watchErrors:
			r.logger.Warn("certificate watch error", "err", err)
		case <-pending.C:
			r.reloadAndLog()
		case <-ticker.C:
			r.reloadAndLog()
		}
	}
}

func (r *Reloader) watch() (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{filepath.Dir(r.certFile): true, filepath.Dir(r.keyFile): true}
	for dir := range dirs {
		if err := w.Add(dir); err != nil {
			w.Close()
			return nil, fmt.Errorf("watch %s: %w", dir, err)
		}
	}
	return w, nil
}

func (r *Reloader) reloadAndLog() {
	// Errors are logged inside reload, once per distinct bad content.
	_, _ = r.reload()
}

// reload reads both files and swaps in the pair if its content is new and
// valid. It reports whether the served certificate changed.
func (r *Reloader) reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	certPEM, err := readBounded(r.certFile)
	if err != nil {
		return false, r.fail(err, nil)
	}
	keyPEM, err := readBounded(r.keyFile)
	if err != nil {
		return false, r.fail(err, nil)
	}
	h := sha256.New()
	h.Write(certPEM)
	h.Write([]byte{0})
	h.Write(keyPEM)
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	if r.current.Load() != nil && sum == r.loadedHash {
		return false, nil
	}

	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, r.fail(fmt.Errorf("servingcert: invalid certificate/key pair: %w", err), &sum)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return false, r.fail(fmt.Errorf("servingcert: parse certificate: %w", err), &sum)
		}
		pair.Leaf = leaf
	}

	first := r.current.Load() == nil
	r.current.Store(&pair)
	r.loadedHash = sum
	r.failedHash = [sha256.Size]byte{}
	msg := "serving certificate reloaded"
	if first {
		msg = "serving certificate loaded"
	}
	r.logger.Info(msg,
		"subject", leaf.Subject.String(),
		"dnsNames", leaf.DNSNames,
		"serial", leaf.SerialNumber.String(),
		"notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	if time.Now().After(leaf.NotAfter) {
		r.logger.Warn("serving certificate has expired", "notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return true, nil
}

// fail logs a failed reload (once per distinct content, so the periodic
// check does not repeat it every interval) and keeps the current pair.
func (r *Reloader) fail(err error, sum *[sha256.Size]byte) error {
	if r.current.Load() == nil {
		return err // initial load: New reports it
	}
	if sum != nil {
		if *sum == r.failedHash {
			return err
		}
		r.failedHash = *sum
	}
	r.logger.Error("keeping the previous serving certificate", "err", err)
	return err
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("servingcert: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("servingcert: read %s: %w", path, err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("servingcert: %s is larger than %d bytes", path, maxFileSize)
	}
	return b, nil
}

// Package revocations reads the per-user revocations of CLI tokens: a
// ConfigMap in the provider cluster that the provider edits with kubectl,
// and that every replica watches (docs/v1alpha2.md, "Revoking one user's
// tokens").
//
// Each data entry of the ConfigMap revokes the tokens of one subject of
// the configured issuer issued before a time. Its key is free (a name for
// the provider's records, in the ConfigMap key alphabet); its value is
//
//	<RFC 3339 time> <subject>
//
// the subject verbatim after the first space (it may hold spaces itself).
// For example:
//
//	kubectl -n kube-bind patch configmap kube-bind-backend-cli-token-revocations --type merge \
//	  -p '{"data":{"alice":"2026-12-02T11:00:00Z 0a1b2c3d-alice"}}'
//
// Two entries for one subject: the later time holds. An entry that does
// not parse revokes nothing and is logged.
package revocations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// maxSubject is the longest subject a CLI token carries.
const maxSubject = 255

// ErrNotSynced: the ConfigMap has not been read yet, so nobody's tokens
// can be judged (503 to the client).
var ErrNotSynced = errors.New("the CLI token revocations are not read yet")

// Parse reads the data of the ConfigMap: the not-before time of each
// subject, and a problem per entry that does not parse (sorted by key).
func Parse(data map[string]string) (map[string]time.Time, []error) {
	out := map[string]time.Time{}
	var errs []error
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		subject, t, err := parseEntry(data[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %q: %w", k, err))
			continue
		}
		if have, ok := out[subject]; !ok || t.After(have) {
			out[subject] = t
		}
	}
	return out, errs
}

func parseEntry(v string) (string, time.Time, error) {
	v = strings.TrimRight(v, "\r\n")
	ts, subject, ok := strings.Cut(v, " ")
	if !ok || subject == "" {
		return "", time.Time{}, errors.New(`want "<RFC 3339 time> <subject>"`)
	}
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%q is not an RFC 3339 time such as 2026-12-02T11:00:00Z", ts)
	}
	if len(subject) > maxSubject || !utf8.ValidString(subject) || strings.ContainsAny(subject, "\r\n") {
		return "", time.Time{}, fmt.Errorf("the subject must be one line of 1 to %d bytes of UTF-8", maxSubject)
	}
	return subject, t, nil
}

// Watcher keeps the revocations of one ConfigMap, read through an
// informer. Safe for concurrent use.
type Watcher struct {
	informer  cache.SharedIndexInformer
	key       string
	log       *slog.Logger
	mu        sync.Mutex
	version   string
	notBefore map[string]time.Time
}

// New watches ConfigMap namespace/name; a missing ConfigMap revokes
// nothing.
func New(client kubernetes.Interface, namespace, name string, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "configmaps", namespace,
		fields.OneTermEqualSelector("metadata.name", name))
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	return &Watcher{informer: inf, key: namespace + "/" + name, log: log}
}

// Run reads and watches the ConfigMap until ctx ends.
func (w *Watcher) Run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// HasSynced says whether the ConfigMap was read once.
func (w *Watcher) HasSynced() bool { return w.informer.HasSynced() }

// NotBefore is the time before which subject's tokens are refused (zero:
// none), or ErrNotSynced.
func (w *Watcher) NotBefore(subject string) (time.Time, error) {
	if !w.informer.HasSynced() {
		return time.Time{}, ErrNotSynced
	}
	obj, exists, err := w.informer.GetStore().GetByKey(w.key)
	if err != nil {
		return time.Time{}, err
	}
	if !exists {
		return time.Time{}, nil
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return time.Time{}, fmt.Errorf("the informer of %s holds a %T", w.key, obj)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cm.ResourceVersion != w.version || w.notBefore == nil {
		nb, errs := Parse(cm.Data)
		for _, e := range errs {
			w.log.Warn("a CLI token revocation does not parse and revokes nothing", "configmap", w.key, "problem", e.Error())
		}
		w.version, w.notBefore = cm.ResourceVersion, nb
	}
	return w.notBefore[subject], nil
}

package apply

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFitFollowsTheKonnectorThatWillServe(t *testing.T) {
	const (
		v048 = "ghcr.io/kube-bind/konnector:v0.4.8"
		v082 = "ghcr.io/kbind-dev/konnector:v0.8.2"
		v2   = "ghcr.io/kbind-dev/konnector:v2.0.0-rc4"
	)
	crdV1alpha1 := []string{"v1alpha1"}
	crdBoth := []string{"v1alpha1", "v1alpha2"}
	kbindCRDs := []string{"connections.core.kbind.io"}
	cases := []struct {
		name  string
		found Found
		skip  bool
		image string
		// refused: the generations refused, each with words the reason
		// must hold; note: words the note of v1alpha2 must hold.
		refused map[string][]string
		note    []string
	}{
		{name: "empty cluster"},
		{name: "empty cluster, konnector elsewhere", skip: true, note: []string{"no konnector found", "--wait-timeout"}},
		{
			name: "v0.4.8 kept with --skip-konnector", found: Found{Image: v048, Served: crdV1alpha1}, skip: true,
			refused: map[string][]string{ProtocolV1alpha2: {"(v0.4.8, Deployment kube-bind/konnector)", "only kube-bind.io/v1alpha1",
				"--skip-konnector", "upgrade the konnector"}},
		},
		{
			name: "v0.4.8 replaced by the bind", found: Found{Image: v048, Served: crdV1alpha1},
			note: []string{"replaces the konnector in this cluster (" + v048 + ") by " + v082, "--protocol v1alpha1 keeps it"},
		},
		{
			name: "only v0.4's CRD, no Deployment, --skip-konnector", found: Found{Served: crdV1alpha1}, skip: true,
			refused: map[string][]string{ProtocolV1alpha2: {"CRD apiservicebindings.kube-bind.io", "only kube-bind.io/v1alpha1"}},
		},
		{name: "v0.8.2 with --skip-konnector serves both", found: Found{Image: v082, Served: crdBoth}, skip: true},
		{name: "v0.8.2 kept", found: Found{Image: v082, Served: crdBoth}},
		{
			name: "a custom image's tag says nothing: the CRD decides", found: Found{Image: "registry:5000/konnector:dev", Served: crdV1alpha1}, skip: true,
			refused: map[string][]string{ProtocolV1alpha2: {"CRD apiservicebindings.kube-bind.io"}},
		},
		{
			name: "a Deployment of a newer konnector whose CRD is not updated yet", found: Found{Image: v082, Served: crdV1alpha1}, skip: true,
		},
		{
			name: "--konnector-image v0.4 cannot serve v1alpha2", image: v048,
			refused: map[string][]string{ProtocolV1alpha2: {"--konnector-image " + v048 + " (v0.4.8)", "konnector v0.5 or newer"}},
		},
		{
			name: "kbind v2 konnector", found: Found{Image: v2, KbindV2: kbindCRDs},
			refused: map[string][]string{ProtocolV1alpha1: {"kbind v2", "core.kbind.io", "no kube-bind.io APIServiceBindings"}, ProtocolV1alpha2: {"kbind v2", "does not bind through yet"}},
		},
		{
			name: "kbind v2's CRDs, konnector elsewhere", found: Found{KbindV2: kbindCRDs}, skip: true,
			refused: map[string][]string{ProtocolV1alpha1: {"kbind v2", "leave out --skip-konnector"}, ProtocolV1alpha2: {"kbind v2"}},
		},
		{
			name: "kbind v2's CRDs, kube-bind's konnector deployed next to them", found: Found{KbindV2: kbindCRDs},
			note: []string{"kbind v2", "next to it"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := fitOf(c.found, c.skip, c.image)
			for _, p := range []string{ProtocolV1alpha1, ProtocolV1alpha2} {
				err := f.Allows(p)
				words, refused := c.refused[p]
				if refused != (err != nil) {
					t.Fatalf("Allows(%s) = %v, want refused %v", p, err, refused)
				}
				var unfit *UnfitError
				if err != nil && (!errors.As(err, &unfit) || unfit.Protocol != p) {
					t.Errorf("Allows(%s) = %#v, want an *UnfitError of %s", p, err, p)
				}
				for _, w := range words {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Allows(%s) = %q, lacks %q", p, err, w)
					}
				}
			}
			note := f.Note(ProtocolV1alpha2)
			if (len(c.note) == 0) != (note == "") {
				t.Errorf("Note(v1alpha2) = %q, want one holding %q", note, c.note)
			}
			for _, w := range c.note {
				if !strings.Contains(note, w) {
					t.Errorf("Note(v1alpha2) = %q, lacks %q", note, w)
				}
			}
		})
	}
}

func TestKbindV2KonnectorByTag(t *testing.T) {
	for image, want := range map[string]bool{
		"ghcr.io/kbind-dev/konnector:v2.0.0-rc4": true,
		"ghcr.io/kbind-dev/konnector:v2.1.0":     true,
		"ghcr.io/kbind-dev/konnector:v0.8.2":     false,
		"ghcr.io/kbind-dev/konnector:latest":     false,
	} {
		if got := isKbindV2(image); got != want {
			t.Errorf("isKbindV2(%q) = %v, want %v", image, got, want)
		}
	}
}

// A wait says what it waits for once it has to, and at its bound ends
// with what to do; the caller's own end is passed on as it is.
func TestAwaitSaysWhatItWaitsFor(t *testing.T) {
	var progress strings.Builder
	bd := &Binder{o: Options{WaitTimeout: 20 * time.Millisecond, Progress: &progress}}
	w := wait{what: "the thing", ifNot: "do this", seen: func() string { return "nothing" }}
	err := bd.await(context.Background(), w, func(context.Context) (bool, error) { return false, nil })
	var wt *WaitTimeoutError
	if !errors.As(err, &wt) || !strings.Contains(err.Error(), "waiting for the thing (last seen: nothing); do this") ||
		!strings.Contains(err.Error(), "--wait-timeout") {
		t.Errorf("await = %v, want a *WaitTimeoutError naming the wait, what was seen and what to do", err)
	}
	if got := progress.String(); strings.Count(got, "waiting up to 20ms (--wait-timeout) for the thing") != 1 {
		t.Errorf("progress %q, want the wait announced once", got)
	}

	progress.Reset()
	if err := bd.await(context.Background(), w, func(context.Context) (bool, error) { return true, nil }); err != nil || progress.Len() != 0 {
		t.Errorf("a condition that holds at once: %v, progress %q; want nil and nothing said", err, progress.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	bd.o.WaitTimeout = time.Hour
	if err := bd.await(ctx, w, func(context.Context) (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("await after the caller's cancel = %v, want context.Canceled", err)
	}
}

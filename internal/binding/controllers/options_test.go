package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/flagvalue"
)

// The controllers' flags: the defaults pass; the credentials', the
// garbage collection's and the Lease's mistakes are reported together.
func TestOptions(t *testing.T) {
	parse := func(args ...string) *Options {
		o := &Options{}
		if err := flagvalue.Parse(args, o.AddFlags); err != nil {
			t.Fatalf("parsing %q: %v", args, err)
		}
		return o
	}
	if err := parse().Complete(10 * time.Minute); err != nil {
		t.Errorf("defaults: %v", err)
	}
	o := parse("--credential-overlap=0s", "--gc-unused-binding-after=1h", "--leader-election-namespace=Not_A_Namespace")
	err := o.Complete(2 * time.Hour)
	for _, want := range []string{"--credential-overlap", "must be longer than the session TTL 2h0m0s", "--leader-election-namespace"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// The shared cache keeps the annotations and labels its readers name.
func TestCacheKeepsWhatControllersRead(t *testing.T) {
	if kbmanager.AnnotationRotate != credentials.AnnotationRotate {
		t.Errorf("the cache keeps %q, the credentials controller reads %q", kbmanager.AnnotationRotate, credentials.AnnotationRotate)
	}
	if kbmanager.AnnotationSettled != credentials.AnnotationSettled {
		t.Errorf("the cache keeps %q, the credentials controller reads %q", kbmanager.AnnotationSettled, credentials.AnnotationSettled)
	}
}

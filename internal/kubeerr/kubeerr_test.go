package kubeerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "namespaces"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"not found", apierrors.NewNotFound(gr, "x"), false},
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("bad"), false},
		{"conflict", apierrors.NewConflict(gr, "x", errors.New("changed")), false},
		{"plain error", errors.New("encoding failed"), false},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "create", 1), true},
		{"timeout", apierrors.NewTimeoutError("took too long", 1), true},
		{"internal", apierrors.NewInternalError(errors.New("etcd")), true},
		{"unavailable", apierrors.NewServiceUnavailable("starting"), true},
		{"wrapped 429", fmt.Errorf("provisioning: %w", apierrors.NewTooManyRequests("slow down", 1)), true},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"refused", &url.Error{Op: "Post", URL: "https://api", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"eof", io.ErrUnexpectedEOF, true},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// Package kubeerr classifies errors of requests to a Kubernetes API
// server, so that every caller answers the same failure the same way.
package kubeerr

import (
	"context"
	"errors"
	"net"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Transient reports whether err is a failure that the same request may
// not meet a moment later: the API server overloaded or answering 5xx or
// 429, a timeout, a connection refused, reset or cut short. A caller
// answers it with 503 and Retry-After, not as a fault of its own.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == 429
	}
	var netErr net.Error // *url.Error from the transport is one too
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		utilnet.IsProbableEOF(err) || utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err)
}

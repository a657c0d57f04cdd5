// Command kube-bind-poll binds APIs of a kube-bind provider into the
// consumer's cluster: it prints a URL to open in a browser (any browser on
// any machine with the poll flow, so it works over SSH; the callback flow
// where a provider offers only that), waits while the user logs in and
// picks the APIs, then creates what the released konnector needs in the
// cluster of the current kubeconfig context (kubeconfig Secret,
// APIServiceExportRequests waited for, the konnector with least-privilege
// RBAC, APIServiceBindings). Installed as kubectl-bind_poll it is the
// kubectl plugin `kubectl bind-poll`. With --output-dir it only writes the
// BindingResponse and its kubeconfig.
//
// Usage:
//
//	kube-bind-poll [flags] <export-url>
//
// Flags, what it creates, its RBAC: docs/client.md.
//
// Exit codes: 0 bound; 1 the binding failed (cluster unreachable, denied,
// expired, timed out, interrupted, a request the provider failed, a
// conflict); 2 usage error (bad flags or arguments, no cluster and no
// --output-dir, output files already there).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

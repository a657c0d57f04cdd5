// Command kube-bind-poll binds APIs of a kube-bind provider into the
// consumer's cluster: it prints a URL to open in a browser (any browser on
// any machine with the poll flow, so it works over SSH; the callback flow
// where a provider offers only that), waits while the user logs in and
// picks the APIs, then creates what the released konnector needs in the
// cluster kubectl would talk to (kubeconfig Secret, APIServiceExportRequests
// waited for, the konnector with least-privilege RBAC, APIServiceBindings).
// Installed as kubectl-bind_poll it is the kubectl plugin
// `kubectl bind-poll`. It takes kubectl's flags for the consumer cluster,
// -o json|yaml and -v N as kubectl does. With --output-dir or
// --print-response it only hands over the BindingResponse, without a
// cluster.
//
// Usage:
//
//	kube-bind-poll [flags] <export-url>
//
// Flags, what it creates, its RBAC: docs/client.md.
//
// Exit codes: 0 bound (or, with --dry-run, planned); 1 the binding failed
// (cluster unreachable, denied, expired, timed out, interrupted, a request
// the provider failed, a conflict); 2 usage error (bad flags or arguments,
// no cluster and no --output-dir, output files already there).
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	name := "kube-bind-poll"
	// kubectl runs plugins by their file name, kubectl-bind_poll.
	if strings.HasPrefix(filepath.Base(os.Args[0]), "kubectl-") {
		name = "kubectl bind-poll"
	}
	code := run(ctx, name, os.Args[1:], ioStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	stop()
	os.Exit(code)
}

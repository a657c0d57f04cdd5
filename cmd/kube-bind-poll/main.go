// Command kube-bind-poll binds APIs of a kube-bind provider with the poll
// flow: it prints a URL to open in any browser (on any machine, so it works
// over SSH), waits while the user logs in and picks the APIs, and writes the
// BindingResponse and the kubeconfig it carries.
//
// Usage:
//
//	kube-bind-poll [flags] <export-url>
//
// Flags:
//
//	--output-dir DIR      where to write binding-response.json and kubeconfig
//	                      (mode 0600; default: the current directory)
//	-o -                  write the BindingResponse JSON to stdout instead of
//	                      files (the kubeconfig is in it, base64-encoded)
//	--force               overwrite existing output files
//	--cluster-id ID       present the cluster ID of an earlier binding, so the
//	                      new one lands in the same provider namespace
//	--timeout DURATION    give up after this long (default: when the session
//	                      expires)
//	--certificate-authority FILE
//	                      also trust the CA certificates in this PEM file
//	-v                    report every poll on stderr
//
// Exit codes: 0 bound; 1 the binding failed (denied, expired, timed out,
// interrupted, provider unreachable or misbehaving, files not writable);
// 2 usage error (bad flags or arguments, output files already there).
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

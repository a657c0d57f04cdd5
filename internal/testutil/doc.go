// Package testutil holds the small helpers every kind of test uses:
// waiting for something that happens in the background (Await), the one
// fake clock (Clock), a client from a kubeconfig the backend issued
// (IssuedConfig) and one metric's value from a registry (MetricValue).
// The stand-ins of the handlers' outside parts are in testutil/fakes; the
// real parts (control plane, identity provider, konnector) in
// internal/localenv, whose testing.go files give them to tests.
package testutil

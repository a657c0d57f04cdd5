// Package tb names the part of testing.TB that the helpers of testutil
// and internal/localenv call. Those packages are also linked into the local
// demo (hack/demo), a program that must not link package testing; a
// *testing.T, *testing.B or testing.TB satisfies TB as it is.
package tb

// TB is what a test helper needs of the test it runs in.
type TB interface {
	Helper()
	Name() string
	Cleanup(func())
	TempDir() string
	Failed() bool
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Main is what TestMain hands to a helper that runs the tests: a *testing.M.
type Main interface {
	Run() int
}

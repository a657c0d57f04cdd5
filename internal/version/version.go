// Package version holds the backend's build version, stamped at link time:
//
//	go build -ldflags "-X github.com/kbprovider/backend/internal/version.Version=v1.2.3" ./cmd/backend
package version

// Version is the build's version; "dev" when not stamped.
var Version = "dev"

# syntax=docker/dockerfile:1
#
# The kube-bind provider backend: a static binary (templates and CRDs are
# embedded with go:embed) on a distroless base, running as non-root.
#
#   docker build --build-arg VERSION=v0.1.0 -t kube-bind-backend:v0.1.0 .
#
# The go build step below is run verbatim by test/image in CI (there is no
# Docker engine there), so keep it one RUN instruction that only uses the
# build arguments declared in this stage.

# Keep in step with the go directive of go.mod (test/image checks it).
ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=v0.0.0-dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
    go build -trimpath -ldflags "-s -w -X github.com/kbprovider/backend/internal/version.Version=${VERSION}" -o /out/backend ./cmd/backend

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/backend /backend
# distroless "nonroot": uid/gid 65532, no shell, CA certificates included.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/backend"]

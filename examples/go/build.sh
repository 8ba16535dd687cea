#!/bin/sh
# Build the Go example sidecar from proto/ alone, offline, with Debian's Go packages:
#   examples/go/build.sh [OUTPUT]      (default: examples/go/build/go-sidecar)
#
# Needs protoc, protoc-gen-go, protoc-gen-go-grpc, go, and the gRPC and protobuf Go sources that
# golang-google-grpc-dev and golang-github-golang-protobuf-1-5-dev install under /usr/share/gocode
# (`make deps` installs them all). The build runs in GOPATH mode, the way Debian builds its own Go
# packages: imports resolve from a private GOPATH (the generated stubs) and then /usr/share/gocode,
# so nothing is downloaded. With network access, a go.mod requiring google.golang.org/grpc works too.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$here/build/go-sidecar}
work=$here/build
pkg=procmesh.example/gen/procmeshv1

# The stubs are generated at build time, never committed: proto/ is the one source, and a stale
# copy cannot drift from it. The .proto files set no go_package, so the import path comes from M flags.
rm -rf "$work/src/$pkg"
mkdir -p "$work/src"
m="Mprocmesh/v1/processor.proto=$pkg,Mprocmesh/v1/types.proto=$pkg"
protoc -I "$repo/proto" \
  --go_out="$work/src" --go_opt="$m" \
  --go-grpc_out="$work/src" --go-grpc_opt="$m" \
  "$repo/proto/procmesh/v1/processor.proto" "$repo/proto/procmesh/v1/types.proto"

cd "$here"
GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOFLAGS= GOCACHE="$work/cache" \
  go build -o "$out" .
echo "built $out"

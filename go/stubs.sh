#!/usr/bin/env bash
# Go stubs for the Go team, generated from protos/ into gen/go/ (gitignored, never
# committed): protoc with protoc-gen-go and protoc-gen-go-grpc, built in GOPATH mode
# against Debian's Go packages (golang-go, golang-google-grpc-dev,
# golang-google-protobuf-dev and golang-github-golang-protobuf-1-5-dev in
# /usr/share/gocode), so it works offline. grpc-go marshals through
# github.com/golang/protobuf: its 1.3 package panics on today's generated messages, the
# 1.5 one (a shim over google.golang.org/protobuf) works.
#
#   bash go/stubs.sh generate   write gen/go/src/dwsearch/gen/go/dwsearch/v1/*.pb.go
#                               (import path = the protos' go_package)
#   bash go/stubs.sh check      generate, then vet, build and run go/cmd/dwsearch-client-check
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GEN=$ROOT/gen/go
PKG=dwsearch/gen/go/dwsearch/v1
# The well-known types (google/protobuf/duration.proto, ...) from libprotobuf-dev.
WKT_INCLUDE=${WKT_INCLUDE:-/usr/include}

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if ((${#missing[@]})); then
    echo "go/stubs.sh: missing ${missing[*]}; install the Debian packages golang-go protobuf-compiler" \
      "libprotobuf-dev protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev" \
      "golang-github-golang-protobuf-1-5-dev" >&2
    exit 1
  fi
}

generate() {
  need protoc protoc-gen-go protoc-gen-go-grpc
  if [[ ! -f $WKT_INCLUDE/google/protobuf/duration.proto ]]; then
    echo "go/stubs.sh: no well-known .proto files under $WKT_INCLUDE (Debian package libprotobuf-dev)" >&2
    exit 1
  fi
  rm -rf "$GEN/src/dwsearch"
  mkdir -p "$GEN/src"
  (
    cd "$ROOT/protos"
    protoc -I . -I "$WKT_INCLUDE" \
      --go_out="$GEN/src" --go-grpc_out="$GEN/src" \
      dwsearch/v1/*.proto
  )
  ls "$GEN/src/$PKG"/*_grpc.pb.go >/dev/null
}

check() {
  need go
  generate
  export GO111MODULE=off GOPATH="$GEN:/usr/share/gocode" GOCACHE="$GEN/cache" GOFLAGS=
  local unformatted
  unformatted=$(gofmt -l "$ROOT/go")
  if [[ -n $unformatted ]]; then
    echo "go/stubs.sh: not gofmt-formatted: $unformatted" >&2
    exit 1
  fi
  go vet "$PKG"
  mkdir -p "$GEN/bin"
  (
    cd "$ROOT/go/cmd/dwsearch-client-check"
    go vet .
    go build -o "$GEN/bin/dwsearch-client-check" .
  )
  "$GEN/bin/dwsearch-client-check"
}

case ${1:-check} in
  generate) generate ;;
  check) check ;;
  *) echo "usage: $0 [generate|check]" >&2; exit 2 ;;
esac

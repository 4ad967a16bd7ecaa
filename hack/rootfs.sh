#!/bin/bash
# rootfs.sh DIR — the image's files, built into DIR: the plugin, the stack
# and the agent (VERSION stamped into the plugin), and the portmap and
# bandwidth plugins (containernetworking/plugins at go.mod's version) the
# agent chains after cni-usernet. GOARCH (environment, default the Go
# toolchain's) picks the architecture. hack/image.sh and hack/release.sh
# build with it, so the lab's image and a release hold the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$1
GO=${GO:-go}
version=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
mkdir -p "$root"
chmod 0755 "$root"   # the image's / (mktemp makes it 0700)
build() { CGO_ENABLED=0 GOOS=linux $GO build -trimpath "$@"; }
# one stamp for the three binaries: each prints it for `version`
stamp="-s -w -X github.com/cni-usernet/cni-usernet/pkg/util/buildinfo.Version=$version"
build -ldflags "$stamp" -o "$root/cni-usernet" ./cmd/cni-usernet
build -ldflags "$stamp" -o "$root/cni-usernet-stack" ./cmd/cni-usernet-stack
build -ldflags "$stamp" -o "$root/cni-usernet-agent" ./cmd/cni-usernet-agent
build -ldflags "-s -w" -o "$root/" \
  github.com/containernetworking/plugins/plugins/meta/portmap \
  github.com/containernetworking/plugins/plugins/meta/bandwidth
chmod 0755 "$root"/cni-usernet "$root"/cni-usernet-stack "$root"/cni-usernet-agent "$root"/portmap "$root"/bandwidth

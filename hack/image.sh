#!/bin/bash
# image.sh — build cni-usernet's container image without a container engine:
# a static binary of ./cmd/cni-usernet and an OCI image-layout tarball holding
# only that binary (entrypoint /cni-usernet), which `ctr images import`
# accepts. Users with a registry can build Containerfile instead.
#   hack/image.sh [OUT_TAR]     default bin/cni-usernet-image.tar
#   IMAGE=registry.example/cni-usernet:v1 hack/image.sh    another reference
# The image is reproducible: same sources, same Go, same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/cni-usernet:dev}
out=${1:-bin/cni-usernet-image.tar}
GO=${GO:-go}
version=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
arch=$($GO env GOARCH)

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
chmod 0755 "$rootfs"   # the image's / (mktemp makes it 0700)
CGO_ENABLED=0 GOOS=linux $GO build -trimpath \
  -ldflags "-s -w -X github.com/cni-usernet/cni-usernet/pkg/plugin.Version=$version" \
  -o "$rootfs/cni-usernet" ./cmd/cni-usernet
chmod 0755 "$rootfs/cni-usernet"
mkdir -p "$(dirname "$out")"
ARCH=$arch hack/k8s/images/mkimage.sh "$IMAGE" "$rootfs" "$out" '["/cni-usernet"]'

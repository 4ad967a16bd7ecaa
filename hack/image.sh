#!/bin/bash
# image.sh — build cni-usernet's container image without a container engine:
# static binaries of ./cmd/cni-usernet, ./cmd/cni-usernet-stack and
# ./cmd/cni-usernet-agent (the DaemonSet's command), and of the
# portmap and bandwidth plugins (containernetworking/plugins at go.mod's
# version) that the agent chains after cni-usernet, and an OCI image-layout
# tarball holding only them (entrypoint /cni-usernet; the agent installs them
# on the node, portmap and bandwidth only where the node has none), which
# `ctr images import` accepts. Users with a registry can build Containerfile instead.
#   hack/image.sh [OUT_TAR]     default bin/cni-usernet-image.tar
#   IMAGE=registry.example/cni-usernet:v1 hack/image.sh    another reference
#   (default: the one manifests/cni-usernet.yaml names, below)
# The image is reproducible: same sources, same Go, same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
# (by default the image manifests/cni-usernet.yaml names: the chart's
# repository at its appVersion, the coming release's tag, so that the
# manifest runs this tree's image once it is imported on the nodes)
chart=charts/cni-usernet
IMAGE=${IMAGE:-$(sed -n '/^image:/,/^[^ ]/s/^  repository: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$chart/values.yaml" | head -1):$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$chart/Chart.yaml")}
out=${1:-bin/cni-usernet-image.tar}
GO=${GO:-go}
version=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
GO=$GO hack/gvisor/patch.sh
arch=$($GO env GOARCH)

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
GO=$GO VERSION=$version hack/rootfs.sh "$rootfs"
mkdir -p "$(dirname "$out")"
ARCH=$arch hack/k8s/images/mkimage.sh "$IMAGE" "$rootfs" "$out" '["/cni-usernet"]'

#!/bin/bash
# build.sh — build the Kubernetes server binaries, kubectl and crictl from the Go
# module proxy into $BIN, unless the right versions are already there.
# (From the k8s-lab recipe; kubectl added: CI machines have none.)
set -euo pipefail
LAB=$(cd "$(dirname "$0")/.." && pwd)
FLANNEL_SRC=$(cd "$LAB/../../third_party/flannel" && pwd)
. "$LAB/lib/common.sh"
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
mkdir -p "$BIN"
# Each release's binaries are built once into a directory of their own
# ($PREFIX/kubernetes/<version>, from the toolmod that pins it:
# lib/common.sh) and copied to $BIN when the lab runs that release, so
# that moving between the default and K8S_LAB_KUBERNETES=1.35 costs a copy,
# not a build.
KDIR=$PREFIX/kubernetes/$K8S_VERSION
mkdir -p "$KDIR"
has_version() { # BINARY: whether it reports $K8S_VERSION
  local v=--version; [ "${1##*/}" = kubectl ] && v="version --client"
  [ -x "$1" ] && "$1" $v 2>/dev/null | grep -qw "$K8S_VERSION"
}
pkgs=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  has_version "$KDIR/$b" || pkgs+=("k8s.io/kubernetes/cmd/$b")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "building Kubernetes $K8S_VERSION: ${pkgs[*]##*/} (${K8S_TOOLMOD#"$LAB/"}/go.mod; the slow part: about 10 min on 2 cores with empty Go caches)"
  s=$(date +%s)
  (cd "$K8S_TOOLMOD" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "$ld" -o "$KDIR/" "${pkgs[@]}")
  log "built in $(( $(date +%s) - s ))s"
fi
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  # (renamed into place: a running daemon keeps its old file)
  has_version "$BIN/$b" || { cp "$KDIR/$b" "$BIN/.$b.new" && mv -f "$BIN/.$b.new" "$BIN/$b"; }
done
if ! [ -x "$BIN/crictl" ]; then
  log "building crictl $CRICTL_VERSION"
  GOBIN=$BIN CGO_ENABLED=0 nice -n 19 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi
# Cluster DNS: CoreDNS from its Go module, with only the plugins the lab uses
# (coredns/main.go), into an image of its own (images/build-images.sh).
if ! [ -x "$BIN/coredns" ]; then
  log "building coredns (coredns/go.mod)"
  s=$(date +%s)
  (cd "$LAB/coredns" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "-s -w" -o "$BIN/coredns" .)
  log "built coredns in $(( $(date +%s) - s ))s"
fi
# flannel, the primary CNI of the chained-mode test (flannel.sh): flanneld
# from its Go module with the vxlan backend only (upstream's main, vendored
# in third_party/flannel), and its CNI plugin from the last
# containernetworking/plugins that carries it (flannel-cni/go.mod).
FLANNEL_VERSION=$(sed -n 's/^[[:space:]]*\(require \)\{0,1\}github.com\/flannel-io\/flannel \(v[^ ]*\)$/\2/p' "$FLANNEL_SRC/go.mod")
if ! { [ -x "$BIN/flanneld" ] && "$BIN/flanneld" --version 2>&1 | grep -qx "$FLANNEL_VERSION"; }; then
  log "building flanneld $FLANNEL_VERSION (third_party/flannel/go.mod)"
  s=$(date +%s)
  (cd "$FLANNEL_SRC" && CGO_ENABLED=0 nice -n 19 go build -trimpath \
    -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" -o "$BIN/flanneld" .)
  log "built flanneld in $(( $(date +%s) - s ))s"
fi
if ! [ -x "$BIN/flannel" ]; then
  log "building flannel's CNI plugin (flannel-cni/go.mod)"
  (cd "$LAB/flannel-cni" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "-s -w" -o "$BIN/flannel" \
    github.com/containernetworking/plugins/plugins/meta/flannel)
fi
# containerd 2 for the K8S_LAB_CONTAINERD=2 variant (lib/common.sh), from
# its Go module (containerd2/go.mod): the daemon, its runc shim and ctr, to
# a directory of their own so that Debian's stay in use by default.
# Without cgo, and so without the btrfs, devmapper and zfs snapshotters
# (the lab uses overlayfs); the shim without gRPC, as upstream builds it.
if [ "$CONTAINERD_VARIANT" = 2 ] &&
   ! { [ -x "$CONTAINERD2_BIN/containerd-shim-runc-v2" ] && [ -x "$CONTAINERD2_BIN/ctr" ] &&
       "$CONTAINERD2_BIN/containerd" --version 2>/dev/null | grep -qw "$CONTAINERD2_VERSION"; }; then
  log "building containerd $CONTAINERD2_VERSION (containerd2/go.mod)"
  s=$(date +%s)
  mkdir -p "$CONTAINERD2_BIN"
  pkg=github.com/containerd/containerd/v2
  ld="-s -w -X $pkg/version.Version=$CONTAINERD2_VERSION -X $pkg/version.Package=$pkg"
  tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
  (cd "$LAB/containerd2" && CGO_ENABLED=0 nice -n 19 go build -trimpath -tags "$tags" -ldflags "$ld" \
    -o "$CONTAINERD2_BIN/" $pkg/cmd/containerd $pkg/cmd/ctr &&
   CGO_ENABLED=0 nice -n 19 go build -trimpath -tags "$tags no_grpc" -ldflags "$ld" \
    -o "$CONTAINERD2_BIN/" $pkg/cmd/containerd-shim-runc-v2)
  log "built containerd in $(( $(date +%s) - s ))s"
fi

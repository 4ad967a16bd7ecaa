#!/bin/bash
# build-images.sh — make the local OCI image tarballs the cluster uses (nothing is
# pulled): pause (static C) and busybox (Debian's busybox-static).
# `build-images.sh agnhost` also makes agnhost's (below), which only the runs
# that ask for it import. (From the k8s-lab recipe.)
set -euo pipefail
LAB=$(cd "$(dirname "$0")/.." && pwd)
. "$LAB/lib/common.sh"
mkdir -p "$IMGDIR"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

busybox_rootfs() { # DIR
  mkdir -p "$1/bin" "$1/etc" "$1/tmp" "$1/proc" "$1/sys" "$1/dev" "$1/root" "$1/var/run"
  chmod 1777 "$1/tmp"
  cp /bin/busybox "$1/bin/busybox"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$1/bin/$a"; done
  mkdir -p "$1/usr/bin" "$1/sbin" "$1/usr/sbin"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$1/etc/group"
}

if [ ! -f "$IMGDIR/pause.tar" ]; then
  mkdir -p "$tmp/pause"
  gcc -static -Os -s -o "$tmp/pause/pause" "$LAB/images/pause.c"
  "$LAB/images/mkimage.sh" "$PAUSE_IMAGE" "$tmp/pause" "$IMGDIR/pause.tar" '["/pause"]'
fi
if [ ! -f "$IMGDIR/busybox.tar" ]; then
  busybox_rootfs "$tmp/bb"
  "$LAB/images/mkimage.sh" "$BUSYBOX_IMAGE" "$tmp/bb" "$IMGDIR/busybox.tar" null '["sh"]'
fi
if [ ! -f "$IMGDIR/coredns.tar" ]; then
  mkdir -p "$tmp/coredns/etc/coredns" "$tmp/coredns/tmp"
  cp "$BIN/coredns" "$tmp/coredns/coredns"
  "$LAB/images/mkimage.sh" "$COREDNS_IMAGE" "$tmp/coredns" "$IMGDIR/coredns.tar" '["/coredns"]'
fi
# agnhost, the Kubernetes e2e tests' image, for the ClusterNetworkPolicy
# conformance suite (hack/k8s/cnp-conformance.sh): its binary from the
# Kubernetes release the lab runs (agnhost/go.mod pins toolmod's), with
# bash and busybox's tools beside it as upstream's image has them, under
# the upstream name and tag the suite's pods name (AGNHOST_IMAGE), so that
# their default pull policy (IfNotPresent) finds it and nothing is pulled.
# In a directory of its own: up.sh and node2.sh import every *.tar of
# IMGDIR, and the lab's other runs need no agnhost.
if [ "${1:-}" = agnhost ] && [ ! -f "$AGNHOST_TAR" ]; then
  mkdir -p "$tmp/agnhost" "${AGNHOST_TAR%/*}"
  busybox_rootfs "$tmp/agnhost"
  log "building agnhost ($LAB/agnhost/go.mod)"
  (cd "$LAB/agnhost" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "-s -w" -o "$tmp/agnhost/agnhost" k8s.io/kubernetes/test/images/agnhost)
  # bash with the libraries it links, at their paths
  cp /bin/bash "$tmp/agnhost/bin/bash"
  for l in $(ldd /bin/bash | grep -o '/[^ ]*'); do
    mkdir -p "$tmp/agnhost$(dirname "$l")"
    cp -L "$l" "$tmp/agnhost$l"
  done
  "$LAB/images/mkimage.sh" "$AGNHOST_IMAGE" "$tmp/agnhost" "$AGNHOST_TAR" '["/agnhost"]' '["pause"]'
fi

#!/bin/bash
# build-images.sh — make the local OCI image tarballs the cluster uses (nothing is
# pulled): pause (static C) and busybox (Debian's busybox-static).
# (From the k8s-lab recipe, without its agnhost image.)
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

#!/bin/bash
# mkimage.sh REF ROOTFS_DIR OUT_TAR ENTRYPOINT_JSON [CMD_JSON]
# Writes a single-layer OCI image-layout tarball (no registry, no tools beyond
# tar/sha256sum) that `ctr -n k8s.io images import` accepts. REF is the full
# image reference, e.g. localhost/k8s-lab/pause:3.10. ARCH (environment,
# default amd64) is the image's architecture. (From the k8s-lab recipe.)
set -euo pipefail
ref=$1 rootfs=$2 out=$3 entry=${4:-null} cmd=${5:-null}
tag=${ref##*:}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blobs/sha256"
# Reproducible layer: fixed order, owner and mtime.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
ldig=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
lsize=$(stat -c %s "$work/layer.tar")
mv "$work/layer.tar" "$work/blobs/sha256/$ldig"
arch=${ARCH:-amd64}
printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"k8s-lab mkimage.sh"}]}' \
  "$arch" "$entry" "$cmd" "$ldig" > "$work/config.json"
cdig=$(sha256sum "$work/config.json" | cut -d' ' -f1)
csize=$(stat -c %s "$work/config.json")
mv "$work/config.json" "$work/blobs/sha256/$cdig"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$cdig" "$csize" "$ldig" "$lsize" > "$work/manifest.json"
mdig=$(sha256sum "$work/manifest.json" | cut -d' ' -f1)
msize=$(stat -c %s "$work/manifest.json")
mv "$work/manifest.json" "$work/blobs/sha256/$mdig"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$mdig" "$msize" "$arch" "$ref" "$tag" > "$work/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$work/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" oci-layout index.json blobs
echo "$out: $ref sha256:$mdig"

#!/bin/bash
# release.sh — the artifacts of a release, from a clean tree, without a
# container engine or a registry:
#
#   make release VERSION=v0.1.0      (or hack/release.sh v0.1.0 [OUT_DIR])
#
# into dist/<VERSION>/ (OUT_DIR):
#   cni-usernet-<V>-image.oci.tar   the image for linux/amd64 and linux/arm64 (one OCI
#                                   index; `ctr images import`, `skopeo copy oci-archive:`
#                                   or `crane push` put it in a registry)
#   cni-usernet-<V>-linux-<arch>.tar.gz   the five binaries (the agent's among them), for a by-hand install
#   cni-usernet-<X.Y.Z>.tgz         the Helm chart (version X.Y.Z, appVersion <V>)
#   cni-usernet.yaml                the manifest rendered from that chart for that image
#   sbom.spdx.json                  what each binary links, the agent's too (hack/release/sbom)
#   SHA256SUMS                      every file above
#
# IMAGE_REPOSITORY names the image (default: the chart's image.repository);
# the tag is the version. The image's bytes depend only on the sources and
# the Go toolchain (hack/k8s/images/mkimage.sh writes them reproducibly).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-${VERSION:-}}
if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release.sh: VERSION must look like v1.2.3 (got '${version}')" >&2
  exit 2
fi
chart_version=${version#v}
out=${2:-dist/$version}
GO=${GO:-go}
HELM=${HELM:-bin/helm}
[ -x "$HELM" ] || make helm >&2
chart=charts/cni-usernet
repo=${IMAGE_REPOSITORY:-$(sed -n '/^image:/,/^[^ ]/s/^  repository: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$chart/values.yaml" | head -1)}
if [[ -z $repo ]]; then
  echo "release.sh: no image repository (set IMAGE_REPOSITORY or image.repository in $chart/values.yaml)" >&2
  exit 2
fi
image="$repo:$version"
GO=$GO hack/gvisor/patch.sh
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Per architecture: the binaries, their tarball, and the image's blobs.
layout="$work/layout"
mkdir -p "$layout/blobs/sha256"
manifests=()
for arch in amd64 arm64; do
  root="$work/rootfs-$arch"
  GO=$GO GOARCH=$arch VERSION=$version hack/rootfs.sh "$root"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -czf "$out/cni-usernet-$version-linux-$arch.tar.gz" .
  # The image for this architecture, then its blobs into the shared layout.
  ARCH=$arch hack/k8s/images/mkimage.sh "$image" "$root" "$work/image-$arch.tar" '["/cni-usernet"]' >&2
  mkdir -p "$work/image-$arch"
  tar -C "$work/image-$arch" -xf "$work/image-$arch.tar"
  cp -n "$work/image-$arch"/blobs/sha256/* "$layout/blobs/sha256/"
  # The per-architecture index's one manifest entry, platform kept, its
  # name annotations dropped: the name goes on the multi-arch index.
  manifests+=("$(sed -e 's/^.*"manifests":\[//' -e 's/\]}$//' -e 's/,"annotations":{[^}]*}//' "$work/image-$arch/index.json")")
done
# One image index for both platforms (a blob), named by the layout's
# index.json as a registry would name it: a runtime pulls its platform's.
(IFS=,; printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "${manifests[*]}") >"$work/multi.json"
mdig=$(sha256sum "$work/multi.json" | cut -d' ' -f1)
msize=$(stat -c %s "$work/multi.json")
mv "$work/multi.json" "$layout/blobs/sha256/$mdig"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$mdig" "$msize" "$image" "$version" >"$layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$out/cni-usernet-$version-image.oci.tar" oci-layout index.json blobs

# The chart, versioned, and the manifest it renders for this image.
"$HELM" package "$chart" --version "$chart_version" --app-version "$version" -d "$out" >&2
# Without the chart's test pod: kubectl apply would start it as a pod of
# its own, where helm runs it only on `helm test`.
"$HELM" template cni-usernet "$out/cni-usernet-$chart_version.tgz" --namespace kube-system --skip-tests \
  --set image.repository="$repo" --set image.tag="$version" >"$out/cni-usernet.yaml"
grep -q "image: \"\{0,1\}$image\"\{0,1\}$" "$out/cni-usernet.yaml" || {
  echo "release.sh: the rendered manifest does not use $image" >&2
  exit 1
}

# What each of the image's binaries links, the agent's among them: every
# file of the amd64 root (the arm64 ones link the same modules).
$GO run ./hack/release/sbom -version "$version" -out "$out/sbom.spdx.json" "$work/rootfs-amd64"/*

(cd "$out" && sha256sum -- * | grep -v ' SHA256SUMS$' >SHA256SUMS)
echo "release $version in $out ($image):"
(cd "$out" && ls -l)

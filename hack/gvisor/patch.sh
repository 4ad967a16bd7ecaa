#!/bin/bash
# patch.sh — third_party/gvisor: the gVisor module that go.mod requires, with
# the patches of hack/gvisor/patches applied in order. go.mod replaces
# gvisor.dev/gvisor with it, so every build of the stack uses the patched
# netstack (docs/gvisor-patches.md says what each patch changes and why).
#
#   hack/gvisor/patch.sh           make the copy unless it is up to date
#   hack/gvisor/patch.sh --check   exit 1 if it is missing or stale
#
# The copy is generated, never edited nor committed: its stamp holds the
# module version and the patches' hashes, and a change to either makes it
# again. A patch that no longer applies (a newer gVisor in go.mod) fails
# here, loudly, naming the patch: re-base it (docs/gvisor-patches.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
dest=third_party/gvisor
stamp=$dest/.cni-usernet-patched

# go.mod's requirement (not `go list -m`: with the replace in place that
# needs the copy this script makes)
version=$(awk '$1 == "gvisor.dev/gvisor" && $2 ~ /^v/ {print $2; exit}' go.mod)
[ -n "$version" ] || { echo "patch.sh: no gvisor.dev/gvisor requirement in go.mod" >&2; exit 1; }
patches=(hack/gvisor/patches/*.patch)
want="$version $(cat "${patches[@]}" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ "${1:-}" = --check ]; then
  echo "patch.sh: $dest is missing or stale: run hack/gvisor/patch.sh" >&2
  exit 1
fi

# The pristine module from the module cache (or the proxy), outside this
# module so that the replace does not apply.
src=$(cd / && GOFLAGS=-mod=mod $GO mod download -json "gvisor.dev/gvisor@$version" |
  sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src/pkg" ] || { echo "patch.sh: downloading gvisor.dev/gvisor@$version failed" >&2; exit 1; }

mkdir -p "${dest%/*}"
tmp=$(mktemp -d "${dest%/*}/.gvisor.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# what a build needs: the module's go.mod and go.sum, its licence, pkg/
cp "$src/go.mod" "$src/go.sum" "$src/LICENSE" "$tmp/"
cp -r "$src/pkg" "$tmp/pkg"
chmod -R u+w "$tmp"
for p in "${patches[@]}"; do
  if ! out=$(patch -d "$tmp" -p1 --forward --batch --no-backup-if-mismatch -r - <"$p" 2>&1); then
    printf '%s\n' "$out" >&2
    echo "patch.sh: $p does not apply to gvisor.dev/gvisor@$version: re-base it (docs/gvisor-patches.md)" >&2
    exit 1
  fi
done
echo "$want" >"$tmp/.cni-usernet-patched"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "patch.sh: $dest is gvisor.dev/gvisor@$version with ${#patches[@]} patch(es)" >&2

#!/usr/bin/env bash
# The policy scale benchmark: the node agent of two builds, run as
# processes against a fake API server holding a synthetic cluster, in one
# run (hack/bench/policyscale/main.go says what it measures).
#
#   hack/bench/policyscale/run.sh [--baseline REV] [--out DIR] [other flags of policyscale]
#   hack/bench/policyscale/run.sh --baseline main --clusters 10k --reps 3
#
# --baseline REV (default: none) builds the agent from a git worktree of
# REV (removed again) beside this tree's build; without it only this tree
# runs. The agent's command is cni-usernet-agent where the build has
# cmd/cni-usernet-agent, else `cni-usernet agent`. Needs root: the
# benchmark runs in network and mount namespaces of its own (the root
# namespaces are not touched). Results: DIR (default results/<UTC
# timestamp>)/policy-scale.md, policy-scale.txt, logs/.
set -euo pipefail

cd "$(dirname "$0")/../../.."

out=""
baseline=""
args=()
while (($#)); do
	case "$1" in
	--out) out="$2"; shift 2 ;;
	--out=*) out="${1#--out=}"; shift ;;
	--baseline) baseline="$2"; shift 2 ;;
	--baseline=*) baseline="${1#--baseline=}"; shift ;;
	*) args+=("$1"); shift ;;
	esac
done
out="${out:-results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [[ $EUID -ne 0 ]]; then
	echo "policyscale/run.sh: must run as root (network and mount namespaces)" >&2
	exit 2
fi

bin="$(mktemp -d /tmp/policyscale-bin.XXXXXX)"
wt=""
cleanup() {
	if [[ -n "$wt" ]]; then
		git worktree remove --force "$wt/src" >/dev/null 2>&1 || true
		rm -rf "$wt"
	fi
	rm -rf "$bin"
}
trap cleanup EXIT

# build_agent SRC DEST: the agent of the tree at SRC into DEST, as
# released (static, without cgo).
build_agent() {
	local src="$1" dest="$2" pkg=./cmd/cni-usernet
	mkdir -p "$dest"
	if [[ -d "$src/cmd/cni-usernet-agent" ]]; then
		pkg=./cmd/cni-usernet-agent
	fi
	(cd "$src" && { [ ! -x hack/gvisor/patch.sh ] || hack/gvisor/patch.sh; } &&
		CGO_ENABLED=0 go build -trimpath -o "$dest/" "$pkg")
}

rev() { git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown; }

cur_rev="$(rev .)"
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
	cur_rev="$cur_rev-dirty"
fi
echo "policyscale/run.sh: building this tree's agent ($cur_rev)" >&2
build_agent . "$bin/current" >"$out/build-current.log" 2>&1 ||
	{ echo "policyscale/run.sh: this tree's agent does not build: $(tail -c 600 "$out/build-current.log")" >&2; exit 1; }
run_args=(--current-bin "$bin/current" --current-rev "$cur_rev")

if [[ -n "$baseline" ]]; then
	wt="$(mktemp -d /tmp/policyscale-baseline.XXXXXX)"
	echo "policyscale/run.sh: building the baseline agent from $baseline" >&2
	git worktree add -q --detach "$wt/src" "$baseline" >&2
	base_rev="$(rev "$wt/src")"
	build_agent "$wt/src" "$bin/baseline" >"$out/build-baseline.log" 2>&1 ||
		{ echo "policyscale/run.sh: the baseline $baseline does not build: $(tail -c 600 "$out/build-baseline.log")" >&2; exit 1; }
	run_args+=(--baseline-bin "$bin/baseline" --baseline-rev "$base_rev")
fi

go build -o "$bin/policyscale" ./hack/bench/policyscale
start=$(date +%s)
"$bin/policyscale" --out "$out" "${run_args[@]}" ${args[@]+"${args[@]}"}
echo "policyscale/run.sh: done in $(($(date +%s) - start)) s: $out/policy-scale.md, $out/policy-scale.txt" >&2

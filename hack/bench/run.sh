#!/usr/bin/env bash
# Benchmark cni-usernet against the kernel veth (ptp) and its peers (gVisor
# runsc, pasta, slirp4netns) on this machine.
#
#   hack/bench/run.sh [--quick] [--out DIR] [--rounds N] [--only a,b] [--peers=false] [--scale=false] [--baseline REV] [--list] [other flags of hack/bench]
#   hack/bench/run.sh --only kernel,usernet-hardware --cpu-limits 100m,500m,2 ...   # also under pod CPU limits
#   hack/bench/run.sh --only pod2pod [--rounds 3] # pod to pod on one node alone (the pod2pod-* rows)
#   hack/bench/run.sh --only xnode [--rounds 3]   # pod to pod across two nodes alone (the xnode-* rows)
#
# Needs root. Everything runs in network namespaces named ub-* that the
# benchmark creates and removes; the root namespace is not touched. The
# limits (--cpu-limits) and sizing (--sizing, on unless --quick) sections
# also make cgroups named ub-bench-* at the top of the cgroup hierarchies
# and remove them. Builds
# ptp, host-local, cni-usernet (optional: its configurations are skipped when
# it does not build), runsc when peers run (hack/bench/peers pins it to the
# gVisor version in go.mod; ~7 min the first time, cached after) and the
# benchmark into a temp dir, runs it, and draws
# ratios.png. Results: DIR (default results/<UTC timestamp>)/table.md,
# samples.json, summary.json, ratios.png, logs/.
set -euo pipefail

cd "$(dirname "$0")/../.."

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

# Peers run in full runs, not with --quick or an --only that names none,
# unless asked for by name or flag.
peers=1
prev=""
for a in ${args[@]+"${args[@]}"}; do
	case "$a" in --quick | --only=*) peers=0 ;; esac
	[[ "$prev" == --only ]] && peers=0
	prev="$a"
done
for a in ${args[@]+"${args[@]}"}; do
	case "$a" in
	--peers=false) peers=0 ;;
	--peers=true) peers=1 ;;
	*runsc* | *pasta* | *slirp4netns*) peers=1 ;;
	esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [[ $EUID -ne 0 ]]; then
	echo "run.sh: must run as root (creates network namespaces)" >&2
	exit 2
fi

# Tools from Debian; installed only when missing.
need=()
for t in iperf3:iperf3 redis-server:redis-server redis-benchmark:redis-tools nginx:nginx-light \
	ab:apache2-utils ethtool:ethtool ss:iproute2 ip:iproute2; do
	command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if ((peers)); then
	for t in pasta:passt slirp4netns:slirp4netns; do
		command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
	done
fi
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
if ((${#need[@]})); then
	echo "run.sh: installing ${need[*]}" >&2
	apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
		echo "run.sh: could not install ${need[*]}; what needs them is skipped with the reason" >&2
fi

bin="$(mktemp -d /tmp/ub-bench-bin.XXXXXX)"
trap 'rm -rf "$bin"' EXIT

echo "run.sh: building plugins into $bin" >&2
hack/gvisor/patch.sh
go build -o "$bin" \
	github.com/containernetworking/plugins/plugins/main/ptp \
	github.com/containernetworking/plugins/plugins/ipam/host-local
# Built as released (make build, hack/image.sh): static, without cgo, so
# the stack sandboxes itself the way it does on users' nodes.
if ! CGO_ENABLED=0 go build -trimpath -o "$bin/" ./cmd/cni-usernet ./cmd/cni-usernet-stack >"$out/build-cni-usernet.log" 2>&1; then
	echo "run.sh: cni-usernet does not build, its configurations are skipped: $(head -c 300 "$out/build-cni-usernet.log")" >&2
	rm -f "$bin/cni-usernet" "$bin/cni-usernet-stack"
fi
# runsc, from the gVisor module version go.mod names, built in its own
# module (hack/bench/peers) so its dependencies stay out of ours.
if ((peers)); then
	want="$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)"
	have="$(cd hack/bench/peers && go list -m -f '{{.Version}}' gvisor.dev/gvisor)"
	if [[ "$want" != "$have" ]]; then
		echo "run.sh: hack/bench/peers pins gVisor $have but go.mod has $want: runsc rows skipped (update hack/bench/peers/go.mod)" | tee "$out/build-runsc.log" >&2
	else
		echo "run.sh: building runsc (gVisor $want)" >&2
		if ! (cd hack/bench/peers && CGO_ENABLED=0 go build -o "$bin/runsc" gvisor.dev/gvisor/runsc) >"$out/build-runsc.log" 2>&1; then
			echo "run.sh: runsc does not build, its rows are skipped: $(head -c 300 "$out/build-runsc.log")" >&2
			rm -f "$bin/runsc"
		fi
	fi
fi
go build -o "$bin/ub-bench" ./hack/bench

rc=0
# --baseline REV: cni-usernet built from another revision (a git worktree
# of REV, removed again) runs as the baseline-hardware row beside this
# tree's build, in the same interleaved rounds: the A/B of a change.
if [[ -n "$baseline" ]]; then
	wt="$(mktemp -d /tmp/ub-bench-baseline.XXXXXX)"
	mkdir -p "$bin/baseline"
	echo "run.sh: building the baseline cni-usernet from $baseline" >&2
	if git worktree add -q --detach "$wt/src" "$baseline" >&2 &&
		(cd "$wt/src" && { [ ! -x hack/gvisor/patch.sh ] || hack/gvisor/patch.sh; } && CGO_ENABLED=0 go build -trimpath -o "$bin/baseline/" ./cmd/cni-usernet $(ls -d ./cmd/cni-usernet-stack 2>/dev/null)) >"$out/build-baseline.log" 2>&1; then
		cp "$bin/host-local" "$bin/ptp" "$bin/baseline/"
		args+=(--baseline-bin "$bin/baseline")
	else
		echo "run.sh: the baseline $baseline does not build, its row is skipped: $(head -c 300 "$out/build-baseline.log" 2>/dev/null)" >&2
	fi
	git worktree remove --force "$wt/src" >/dev/null 2>&1 || true
	rm -rf "$wt"
fi

"$bin/ub-bench" --bin "$bin" --out "$out" ${args[@]+"${args[@]}"} || rc=$?

if [[ -f "$out/summary.json" ]]; then
	/usr/bin/python3 hack/bench/plot.py "$out" || echo "run.sh: plotting failed (numbers are in table.md)" >&2
fi
exit "$rc"

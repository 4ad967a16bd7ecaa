#!/usr/bin/env bash
# The newcomer's demo: build cni-usernet, attach a "pod" namespace to a
# "node" namespace through the real plugin with manifests/10-cni-usernet.conflist
# (via cnitool, as a runtime would), serve HTTP in the pod, fetch it from the
# node, ping, print the status table with the GSO decision, clean up.
# Everything happens inside two namespaces this script creates.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces)"; exit 1; }

hack/deps.sh
echo "== building"
make -s build

NODE=usernet-demo-node POD=usernet-demo-pod
WORK=$(mktemp -d /tmp/usernet-demo.XXXX)
# The example conflist, with state and leases kept in this run's directory.
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
c = json.load(open("manifests/10-cni-usernet.conflist"))
p = c["plugins"][0]
# The socket redirect's programs, pinned apart from the node's and
# unpinned by cleanup.
p.update(stateDir=work + "/state", logDir=work + "/log", runDir=work + "/run", bpfDir="/sys/fs/bpf/cni-usernet-demo")
p["ipam"]["dataDir"] = work + "/ipam"
json.dump(c, open(work + "/10-cni-usernet.conflist", "w"), indent=2)
PY
export NETCONFPATH=$WORK CNI_PATH=$PWD/bin/cni
# nsenter, not ip netns exec: the plugin pins the stack's own namespace with
# a bind mount, which must land in this mount namespace, not in a private
# one of ip netns exec's that is gone when the command ends.
cnitool() { nsenter --net="/var/run/netns/$NODE" "$PWD/bin/cnitool" "$@"; }

cleanup() {
  set +e
  kill "${PIDS[@]}" 2>/dev/null
  [ -e "/var/run/netns/$POD" ] && cnitool del cni-usernet "/var/run/netns/$POD" >/dev/null
  ip netns del "$POD" 2>/dev/null; ip netns del "$NODE" 2>/dev/null
  rm -rf "$WORK" /sys/fs/bpf/cni-usernet-demo
}
PIDS=()
trap cleanup EXIT
ip netns del "$POD" 2>/dev/null || true; ip netns del "$NODE" 2>/dev/null || true
ip netns add "$NODE"; ip netns add "$POD"
ip -n "$NODE" link set lo up; ip -n "$POD" link set lo up

echo "== ADD: attaching the pod through cni-usernet (gso from the pod annotation: software)"
export CAP_ARGS='{"io.kubernetes.cri.pod-annotations":{"cni-usernet.io/gso":"software"}}'
cnitool add cni-usernet "/var/run/netns/$POD" | tee "$WORK/result.json"
POD_IP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ips"][0]["address"].split("/")[0])' "$WORK/result.json")
NODE_IP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ips"][0]["gateway"])' "$WORK/result.json")

echo "== the pod's namespace: lo and eth0, the stack's TUN with the pod IP; no link to the wire"
ip -n "$POD" -br addr
ip -n "$POD" -d link show eth0 | sed -n 3p | sed 's/^ */   /'
echo "== the stack's own namespace: the pod's veth end, no kernel address (the stack owns them)"
WIRE=$(python3 -c 'import glob, json, sys; print(json.load(open(glob.glob(sys.argv[1] + "/state/*.json")[0]))["wireNetns"])' "$WORK")
echo "   ($WIRE, pinned like ip netns add's: ip netns exec $(basename "$WIRE") ...)"
nsenter --net="$WIRE" ip -br addr

mkdir -p "$WORK/www"; echo "hello from a pod behind a userspace TCP/IP stack" > "$WORK/www/index.html"
ip netns exec "$POD" python3 -m http.server 8080 -d "$WORK/www" >"$WORK/http.log" 2>&1 & PIDS+=($!)
for _ in $(seq 50); do ip netns exec "$NODE" curl -s -o /dev/null "http://$POD_IP:8080/" && break; sleep 0.1; done

echo "== node -> pod: HTTP"
ip netns exec "$NODE" curl -sS "http://$POD_IP:8080/"
echo "   the pod's server saw the client as: $(awk '/GET/{print $1; exit}' "$WORK/http.log") (the node, $NODE_IP: source preserved)"
echo "== pod -> node: HTTP (the pod's own kernel TCP, relayed by the stack from the pod IP)"
mkdir -p "$WORK/nodewww" && echo "hello from the node" >"$WORK/nodewww/index.html"
ip netns exec "$NODE" python3 -m http.server 8081 -d "$WORK/nodewww" >"$WORK/node-http.log" 2>&1 & PIDS+=($!)
for _ in $(seq 50); do ip netns exec "$NODE" curl -s -o /dev/null "http://$NODE_IP:8081/" && break; sleep 0.1; done
ip netns exec "$POD" curl -sS "http://$NODE_IP:8081/"
echo "   the node's server saw the client as: $(tail -1 "$WORK/node-http.log" | cut -d' ' -f1) (the pod IP, $POD_IP)"
echo "== pod -> node: a closed port is refused, as by a kernel"
ip netns exec "$POD" curl -sS -m 3 "http://$NODE_IP:9/" 2>&1 | sed 's/^/   /' || true
echo "== node -> pod: ping (answered by the pod's userspace stack)"
ip netns exec "$NODE" ping -c 2 -i 0.3 "$POD_IP" | tail -2
echo "== pod -> node: ping (relayed by the stack)"
ip netns exec "$POD" ping -c 2 -i 0.3 "$NODE_IP" | tail -2

echo "== cni-usernet status"
bin/cni-usernet status --state-dir "$WORK/state"
echo
echo "== DEL"
cnitool del cni-usernet "/var/run/netns/$POD"
echo "demo OK"

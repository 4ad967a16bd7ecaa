#!/bin/bash
# flannel.sh — a real flannel (vxlan backend) on the lab's two nodes, the
# primary CNI that cni-usernet's chained mode is tested behind (hack/k8s/e2e.sh).
#
#   hack/k8s/flannel.sh up     flanneld on each node, flannel's conflist and plugin on each node
#   hack/k8s/flannel.sh down   stop flanneld, remove flannel.1, cni0, its files and its iptables chains
#
# flanneld runs per node like the lab's kubelet (node 1 in the machine's root
# namespaces, node 2 in its own through node2.sh), with --kube-subnet-mgr: each
# node's subnet is its spec.podCIDR, the VTEP address its node IP. The CNI
# side is what kube-flannel's DaemonSet installs: /etc/cni/net.d/10-flannel.conflist
# (flannel, delegating to bridge + host-local, then portmap) and the flannel
# plugin in /opt/cni/bin (bridge, host-local, portmap: Debian's, already there).
#
# Kept inside the machine: the VXLAN endpoints are the node IPs (10.242.0.1 on
# lo, 10.242.0.2 on node 2's eth0), so the encapsulated traffic only ever goes
# over the lab's own link k8slab-n2; no FORWARD accept rules
# (--iptables-forward-rules=false: they would sit before the lab's guard); and
# the VXLAN port of node 1 takes nothing but what comes over that link
# (K8S-LAB-GUARD-IN). --ip-masq as kube-flannel runs it: flanneld masquerades
# pod traffic that leaves the pod network (which the guard drops anyway), and
# the plugin then tells bridge not to masquerade (without it, bridge would
# masquerade pod-to-pod traffic across nodes and servers would see the node's
# flannel.1 address instead of the client pod's). The overlay's MTU is the one of a 1500-byte
# underlay, 1450 (flannel would take lo's 65536 on node 1 otherwise).
set -euo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
. "$LAB/lib/common.sh"
export KUBECONFIG=$STATE/admin.kubeconfig

N2=$STATE/node2
VXLAN_PORT=8472
NETCONF=$ETC/flannel-net-conf.json
CONFLIST=10-flannel.conflist

conflist() {
  cat <<'EOF'
{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "flannel",
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
EOF
}

up() {
  local t0; t0=$(date +%s)
  [ -x "$BIN/flanneld" ] && [ -x "$BIN/flannel" ] || die "flanneld or the flannel plugin is not built (lib/build.sh)"
  [ "$K8S_LAB_NODES" = 2 ] || die "flannel.sh needs the two-node lab"
  mkdir -p "$ETC"
  # (dual-stack: flannel's second VXLAN device, flannel-v6.1, between the
  # nodes' IPv6 addresses, and the pods' IPv6 subnets from spec.podCIDRs)
  local v6=
  [ -n "$DUAL" ] && v6='"EnableIPv6": true, "IPv6Network": "'$POD_NET6'",'
  cat >"$NETCONF" <<EOF
{
  "Network": "$POD_NET",
  "EnableIPv4": true, $v6
  "Backend": { "Type": "vxlan", "Port": $VXLAN_PORT, "MTU": 1500 }
}
EOF
  # node 1's VXLAN socket listens on every address of the root namespace
  local ipt
  for ipt in iptables ${DUAL:+ip6tables}; do
    if ! $ipt -w -S K8S-LAB-GUARD-IN >/dev/null 2>&1; then $ipt -w -N K8S-LAB-GUARD-IN; fi
    $ipt -w -C INPUT -j K8S-LAB-GUARD-IN 2>/dev/null || $ipt -w -I INPUT 1 -j K8S-LAB-GUARD-IN
    $ipt -w -F K8S-LAB-GUARD-IN
    $ipt -w -A K8S-LAB-GUARD-IN -p udp --dport $VXLAN_PORT ! -i k8slab-n2 -j DROP
  done

  local args=(--kube-subnet-mgr --kubeconfig-file="$STATE/admin.kubeconfig" --net-config-path="$NETCONF"
    --ip-masq --iptables-forward-rules=false --healthz-port=0)
  start_daemon flanneld env NODE_NAME="$NODE" "$BIN/flanneld" "${args[@]}" --iface="$NODE_IP" ${DUAL:+--public-ipv6="$NODE_IP6"}
  # Node 2's /run/flannel is its own (node2.sh's bind mount), or its
  # flanneld writes node 1's subnet file: put the mount back if a removal
  # of node 1's directory took it away.
  "$LAB/node2.sh" exec sh -c "mkdir -p /run/flannel; mountpoint -q /run/flannel || mount --bind $N2/run_flannel /run/flannel"
  "$LAB/node2.sh" daemon flanneld-node2 env NODE_NAME="$NODE2" "$BIN/flanneld" "${args[@]}" --iface=eth0 ${DUAL:+--public-ipv6="$NODE2_IP6"}
  wait_for "flannel's subnet on $NODE" 60 test -s /run/flannel/subnet.env
  wait_for "flannel's subnet on $NODE2" 60 test -s "$N2/run_flannel/subnet.env"

  # what kube-flannel's init containers do: the plugin, then the conflist
  # (last: containerd picks the network up as soon as the file is there)
  local d
  for d in /opt/cni/bin "$N2/opt_cni_bin"; do install -m 0755 "$BIN/flannel" "$d/flannel"; done
  for d in /etc/cni/net.d "$N2/etc_cni_net.d"; do
    conflist >"$d/.$CONFLIST.tmp"; mv "$d/.$CONFLIST.tmp" "$d/$CONFLIST"
  done
  wait_for "node $NODE Ready on flannel" 120 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  wait_for "node $NODE2 Ready on flannel" 120 sh -c "kubectl get node $NODE2 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  log "flannel up in $(( $(date +%s) - t0 ))s: $(tr '\n' ' ' </run/flannel/subnet.env)"
}

down() {
  set +e   # best effort: take away whatever is there
  stop_daemon flanneld 20
  stop_daemon flanneld-node2 20   # (gone already when node 2 went down)
  if [ -d "$N2" ] && "$LAB/node2.sh" exec true 2>/dev/null; then
    "$LAB/node2.sh" exec sh -c "ip link del flannel.1 2>/dev/null; ip link del flannel-v6.1 2>/dev/null; ip link del cni0 2>/dev/null; true"
    rm -f "$N2/etc_cni_net.d/$CONFLIST" "$N2/opt_cni_bin/flannel" "$N2/run_flannel/subnet.env"
  fi
  ip link del flannel.1 2>/dev/null && log "removed flannel.1" || true
  ip link del flannel-v6.1 2>/dev/null && log "removed flannel-v6.1" || true
  ip link del cni0 2>/dev/null && log "removed cni0" || true
  rm -f "/etc/cni/net.d/$CONFLIST" /opt/cni/bin/flannel
  # Only the file: removing /run/flannel itself would also take away the
  # bind mount node 2 has on it (a mount point in another namespace).
  rm -f /run/flannel/subnet.env
  rm -rf /var/lib/cni/flannel /var/lib/cni/networks/cbr0
  # chains flanneld's traffic manager made (FLANNEL-POSTRTG, hooked into
  # POSTROUTING for --ip-masq), and the lab's VXLAN guard
  # (both families: flanneld makes the same chains in ip6tables when dual-stack)
  local table c ipt
  for ipt in iptables ip6tables; do
    for table in filter nat; do
      for c in $($ipt -w -t $table -S 2>/dev/null | awk '/^-N FLANNEL-/{print $2}'); do
        $ipt -w -t $table -S 2>/dev/null | grep -E "^-A [A-Z]+ .*-j $c\$" | sed 's/^-A/-D/' | while read -r rule; do
          eval $ipt -w -t $table "$rule" 2>/dev/null || true
        done || true
        $ipt -w -t $table -F "$c" 2>/dev/null; $ipt -w -t $table -X "$c" 2>/dev/null || true
      done
    done
    # the bridge plugin's per-pod masquerade chains (CNI-<hash>, hooked into
    # POSTROUTING with a comment naming the network), had a pod's DEL missed
    # them (bridge only masquerades when flanneld does not: not with --ip-masq)
    $ipt -w -t nat -S POSTROUTING 2>/dev/null | grep -E -- '--comment "name: \\"cbr0\\" id: ' | while read -r rule; do
      c=${rule##*-j }
      eval $ipt -w -t nat "${rule/-A/-D}" && { $ipt -w -t nat -F "$c"; $ipt -w -t nat -X "$c"; } || true
    done || true   # (grep finds none: the usual case)
    if $ipt -w -S K8S-LAB-GUARD-IN >/dev/null 2>&1; then
      $ipt -w -D INPUT -j K8S-LAB-GUARD-IN 2>/dev/null || true
      $ipt -w -F K8S-LAB-GUARD-IN; $ipt -w -X K8S-LAB-GUARD-IN
    fi
  done
  rm -f "$NETCONF"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

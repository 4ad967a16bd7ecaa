#!/bin/bash
# down.sh — stop the cluster started by up.sh and undo its host changes: pods
# and their veths/netns, cni-usernet (uninstalled through its DaemonSet when it
# is still there), iptables rules, kube-proxy's nft tables, the lo address, sysctls, and the CNI
# directories as up.sh found them.
#   hack/k8s/down.sh          stop everything, keep cluster state (etcd data, PKI)
#   hack/k8s/down.sh --purge  also delete cluster state, containerd's store and logs
#                             (built binaries and image tarballs in /opt/k8s-lab stay)
# Only processes recorded in /run/k8s-lab/*.pid (started by up.sh) and stacks
# recorded in cni-usernet's state files are stopped.
#
# Origin: the k8s-lab recipe's teardown.sh (../shared/k8s-lab/), plus the
# cni-usernet uninstall and the restore of the CNI directories.
set -uo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$LAB/../.." && pwd)
. "$LAB/lib/common.sh"
lab_lock
purge=0; [ "${1:-}" = --purge ] && purge=1
export KUBECONFIG=$STATE/admin.kubeconfig

# 0. While the API server runs: delete the workload pods (CNI DEL runs while
#    cni-usernet is still installed), then the DaemonSet, whose agent
#    uninstalls what it installed.
if pid_alive kube-apiserver && pid_alive kubelet && kubectl get --raw /readyz >/dev/null 2>&1; then
  for ns in $(kubectl get ns -o jsonpath='{.items[*].metadata.name}' 2>/dev/null); do
    case "$ns" in kube-system | kube-public | kube-node-lease) continue ;; esac
    kubectl -n "$ns" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || log "deleting pods of $ns failed"
  done
  # CoreDNS runs on the pod network too: its pods go before the CNI plugin.
  kubectl -n kube-system delete deploy coredns --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  for _ in $(seq 60); do
    kubectl -n kube-system get pods -l k8s-app=kube-dns -o name 2>/dev/null | grep -q . || break
    sleep 1
  done
  if kubectl -n kube-system get ds cni-usernet >/dev/null 2>&1; then
    log "uninstalling cni-usernet (kubectl delete -f manifests/cni-usernet.yaml)"
    kubectl delete -f "$REPO/manifests/cni-usernet.yaml" --wait=true --timeout=90s >/dev/null 2>&1 ||
      log "kubectl delete of cni-usernet failed"
    for _ in $(seq 60); do
      kubectl -n kube-system get pods -l app.kubernetes.io/name=cni-usernet -o name 2>/dev/null | grep -q . || break
      sleep 1
    done
  fi
fi

# 1. node 2 (its kubelet, pods, containerd, kube-proxy, namespaces, link),
#    then node 1's kubelet first, so that it does not restart what we remove next.
"$LAB/node2.sh" down || log "node 2 teardown reported errors"
stop_daemon kubelet 30
# 2. every pod sandbox: StopPodSandbox runs CNI DEL, which removes veths, netns,
#    IPs. Workload pods first, while a CNI installer in kube-system is still
#    around to answer their DEL.
if pid_alive containerd && [ -x "$BIN/crictl" ]; then
  for p in $(crictl pods -q 2>/dev/null | while read -r id; do
    ns=$(crictl inspectp -o go-template --template '{{.status.metadata.namespace}}' "$id" 2>/dev/null)
    if [ "$ns" = kube-system ]; then echo "2 $id"; else echo "1 $id"; fi
  done | sort | cut -d' ' -f2); do
    out=$(crictl stopp "$p" 2>&1) || log "stopp $p failed: ${out##*desc = }"
    crictl rmp -f "$p" >/dev/null 2>&1 || true
  done
  # anything left running in containerd's k8s.io namespace (should be nothing)
  for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
  done
  sleep 1
fi
# flannel (flannel.sh), when the chained-mode test ran: its daemons, links,
# files and chains; after the pods, whose DEL needs its plugin.
"$LAB/flannel.sh" down || log "flannel teardown reported errors"
# 3. the rest of the control plane.
stop_daemon kube-proxy 20
# --cleanup removes every mode's rules whatever the mode was: iptables'
# KUBE-* chains, IPVS' (none on this kernel), and nftables mode's
# `kube-proxy` tables (ip, ip6). Node 2's go with its namespace.
[ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
for fam in ip ip6; do
  nft list table "$fam" kube-proxy >/dev/null 2>&1 || continue
  nft delete table "$fam" kube-proxy && log "removed the nft table $fam kube-proxy (kube-proxy --cleanup left it)"
done
stop_daemon kube-scheduler 20
stop_daemon kube-controller-manager 20
stop_daemon kube-apiserver 30
stop_daemon etcd 30
stop_daemon containerd 30
rm -f "$CONTAINERD_VARIANT_FILE"
# containerd-shim-runc-v2 processes outlive containerd only while their task runs;
# kill the ones that serve the k8s.io namespace (none should be left).
for pid in $(pgrep -f 'containerd-shim-runc-v2 -namespace k8s.io' 2>/dev/null); do
  log "killing leftover shim $pid"; kill -KILL "$pid" 2>/dev/null || true
done

# 4. cni-usernet stacks that outlived their pods (a failed test run): each state
#    file names its stack's PID and kernel start time; stop exactly that process.
for f in /var/lib/cni-usernet/*.json; do
  [ -f "$f" ] || continue
  pid=$(sed -n 's/^ *"stackPID": *\([0-9]*\).*/\1/p' "$f")
  start=$(sed -n 's/^ *"stackStartTime": *\([0-9]*\).*/\1/p' "$f")
  if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -r "/proc/$pid/stat" ] &&
     [ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" = "$start" ]; then
    log "stopping leftover cni-usernet stack $pid ($f)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  log "removing leftover attachment state $f"
  rm -f "$f"
done
# ... and stacks whose state file was lost: "<bin> stack --config
# /var/lib/cni-usernet/stacks/<key>/config.json" (the plugin's layout).
for c in /proc/[0-9]*/cmdline; do
  tr '\0' ' ' <"$c" 2>/dev/null | grep -qE '^[^ ]+ stack --config /var/lib/cni-usernet/stacks/' || continue
  pid=${c#/proc/}; pid=${pid%/cmdline}
  log "stopping leftover cni-usernet stack $pid (no state)"
  kill -KILL "$pid" 2>/dev/null || true
done

# 5. mounts, network namespaces, interfaces left behind by pods.
# (kubelet also bind-mounts /var/lib/kubelet onto itself to make it rshared)
grep -oE ' /(var/lib/kubelet|run/containerd)(/[^ ]+)? ' /proc/mounts | tr -d ' ' | sort -r | while read -r m; do
  umount -l "$m" 2>/dev/null || true
done
for ns in $(ls /run/netns 2>/dev/null | grep '^cni-'); do
  ip netns del "$ns" 2>/dev/null && log "removed leftover netns $ns"
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  case "$l" in
    veth* | usn*)
      # only veths that carry our pod gateway addresses
      if ip -4 addr show dev "$l" 2>/dev/null | grep -q ' inet 10\.244\.'; then
        ip link del "$l" 2>/dev/null && log "removed leftover $l"
      fi ;;
  esac
done

# 6. host settings.
# KUBE-* chains of kubelet (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) and whatever
# kube-proxy --cleanup left: unhook them from the built-in chains, then delete.
for ipt in iptables ip6tables; do
  for table in filter nat mangle; do
    $ipt -w -t $table -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | while read -r rule; do
      eval $ipt -w -t $table "${rule/-A/-D}" 2>/dev/null || true
    done
    for c in $($ipt -w -t $table -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -w -t $table -F "$c" 2>/dev/null; done
    for c in $($ipt -w -t $table -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -w -t $table -X "$c" 2>/dev/null; done
  done
done
# (both families: a dual-stack lab has the same guard and portmap chains
# in ip6tables)
# The guard (up.sh) must have stayed in place until now, hooked and with
# its rule for the Service range, or lab traffic may have left the
# machine during the run: said, and down.sh exits non-zero.
guard_gone=
for ipt in iptables ip6tables; do
  svc=$SVC_CIDR; [ $ipt = ip6tables ] && svc=$SVC_CIDR6
  # (a dual-stack lab's: ip6tables' guard exists only there)
  if $ipt -w -S K8S-LAB-GUARD >/dev/null 2>&1 || $ipt -w -S K8S-LAB-GUARD-OUT >/dev/null 2>&1; then
    for hook in "FORWARD K8S-LAB-GUARD -j DROP" "OUTPUT K8S-LAB-GUARD-OUT -d $svc -j REJECT"; do
      set -- $hook
      $ipt -w -C "$1" -j "$2" 2>/dev/null && $ipt -w -S "$2" 2>/dev/null | grep -q -- " ${*:3}" ||
        { log "WARNING: $ipt's $2 was no longer in $1 with its rule '${*:3}'"; guard_gone=1; }
    done
  fi
  for hook in FORWARD:K8S-LAB-GUARD OUTPUT:K8S-LAB-GUARD-OUT; do
    while $ipt -w -D "${hook%%:*}" -j "${hook#*:}" 2>/dev/null; do :; done
    $ipt -w -F "${hook#*:}" 2>/dev/null && $ipt -w -X "${hook#*:}"
  done
  # portmap plugin chains (only present if a pod used hostPort)
  for c in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do
    $ipt -w -t nat -S "$c" >/dev/null 2>&1 || continue
    for parent in PREROUTING OUTPUT POSTROUTING; do
      while $ipt -w -t nat -S "$parent" | grep -q -- "-j $c"; do
        rule=$($ipt -w -t nat -S "$parent" | grep -- "-j $c" | head -1 | sed 's/^-A/-D/')
        eval $ipt -w -t nat "$rule" || break
      done
    done
  done
  for c in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do
    $ipt -w -t nat -F "$c" 2>/dev/null && $ipt -w -t nat -X "$c" 2>/dev/null
  done
done
ip addr del "$NODE_IP/32" dev lo 2>/dev/null && log "removed $NODE_IP from lo"
ip -6 addr del "$NODE_IP6/128" dev lo 2>/dev/null && log "removed $NODE_IP6 from lo"
# routes cni-usernet's agent made to other nodes' pods (pkg/agent/noderoutes, protocol
# 117) that a failed run left; the agent removes them on uninstall.
ip route flush proto 117 2>/dev/null || true
ip -6 route flush proto 117 2>/dev/null || true
if [ -f "$STATE/sysctl.orig" ]; then
  while IFS='=' read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <"$STATE/sysctl.orig"
  rm -f "$STATE/sysctl.orig"
  log "restored sysctls"
fi

if [ -f "$STATE/netns-mount" ]; then
  # Only while nothing else (another user's `ip netns`) has namespaces there.
  if [ -z "$(ls -A /run/netns 2>/dev/null)" ] && umount /run/netns 2>/dev/null; then
    log "unmounted /run/netns"
  else
    log "left the /run/netns bind mount: namespaces in use there"
  fi
  rm -f "$STATE/netns-mount"
fi

# 7. the CNI directories as up.sh found them: files added since are removed,
#    changed ones reported (never overwritten: we do not know the old bytes).
if [ -f "$STATE/cni-before" ]; then
  find /opt/cni/bin /etc/cni/net.d -type f 2>/dev/null | while read -r f; do
    grep -q "^file [0-9a-f]*  $f\$" "$STATE/cni-before" || { rm -f "$f" && log "removed $f (added while the cluster ran)"; }
  done
  sed -n 's/^file //p' "$STATE/cni-before" | while read -r sum f; do
    if [ ! -f "$f" ]; then log "WARNING: $f was there before up.sh and is gone"
    elif [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$sum" ]; then log "WARNING: $f changed while the cluster ran"
    fi
  done
  find /etc/cni/net.d -mindepth 1 -type d -empty -delete 2>/dev/null
  for d in $(sed -n 's/^absent //p' "$STATE/cni-before"); do
    case "$d" in
      /var/lib/cni | /var/lib/cni-usernet | /var/log/cni-usernet | /run/cni-usernet) rm -rf "$d" ;;
      *) find "$d" -depth -type d -empty -delete 2>/dev/null ;;
    esac
    [ -e "$d" ] && log "WARNING: $d was absent before up.sh and is not empty now"
  done
  rm -f "$STATE/cni-before"
fi

# 8. optional purge of state (binaries and image tarballs stay in $PREFIX).
if [ $purge = 1 ]; then
  log "purging state"
  rm -rf "$STATE" /var/lib/kubelet /var/lib/containerd /run/containerd "$ETC" "$LOGDIR" /var/log/pods /var/log/containers \
    /var/lib/cni/networks/k8s-lab /var/lib/cni/results \
    /etc/cni/net.d/99-k8s-lab-ptp.conflist /etc/crictl.yaml "$RUNDIR"
fi
log "teardown done"
[ -z "$guard_gone" ] || { log "ERROR: the lab's guard was gone before the teardown (see WARNING above)"; exit 1; }

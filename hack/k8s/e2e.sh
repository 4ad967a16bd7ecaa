#!/bin/bash
# e2e.sh — what `make e2e` runs: bring up the two-node cluster (unless one
# is running), build the image, run test/e2e against the cluster in each mode
# (standalone, then chained behind flannel; E2E_MODES="standalone" or "chain"
# runs one; E2E_RUN is go test's -run), and tear the cluster down again, also
# when something failed (E2E_KEEP_CLUSTER=1 keeps it, for iterating).
# K8S_LAB_CONTAINERD=2 runs the lab on containerd 2 instead of Debian's 1.6
# (lib/common.sh); K8S_LAB_PROXY_MODE=nftables runs kube-proxy in nftables
# mode (up.sh); K8S_LAB_IP_FAMILY=ipv4 makes the cluster IPv4-only instead
# of dual-stack, K8S_LAB_TOPOLOGY=routed puts a router between the nodes
# (lib/common.sh). Exits non-zero when anything failed.
set -uo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$LAB/../.." && pwd)
. "$LAB/lib/common.sh"
lab_lock
cd "$REPO"

rc=0
lab_purge_at_exit

# What a CI log needs to tell why a run failed; printed before the teardown
# removes the logs.
dump_logs() {
  log "---- diagnostics"
  kubectl get nodes,pods -A -o wide 2>&1 | sed 's/^/  /'
  kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -40 | sed 's/^/  /'
  kubectl -n kube-system logs -l app.kubernetes.io/name=cni-usernet --tail=80 --prefix 2>&1 | sed 's/^/  /'
  for d in flanneld flanneld-node2; do
    [ -f "$LOGDIR/$d.log" ] && { echo "  == $LOGDIR/$d.log"; grep -E '^[EW]' "$LOGDIR/$d.log" | tail -15 | sed 's/^/  /'; }
  done
  for f in /var/log/cni-usernet/*.log; do
    [ -f "$f" ] && { echo "  == $f"; tail -20 "$f" | sed 's/^/  /'; }
  done
  for d in kubelet containerd kubelet-node2 containerd-node2; do
    echo "  == $LOGDIR/$d.log"; grep -iE 'error|fail' "$LOGDIR/$d.log" 2>/dev/null | tail -25 | sed 's/^/  /'
  done
}

# record MODE RESULT SECONDS: a line of what ran, on what, and how it
# ended, appended to E2E_RECORD (hack/k8s/runs.tsv by default), from which
# hack/k8s/compat.sh renders docs/compatibility.md's matrix. Only what the
# run itself reads from the nodes, the cluster and the tools.
E2E_RECORD=${E2E_RECORD:-$LAB/runs.tsv}
record() {
  local cg=v1 primary=none k8s rt
  [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && cg=v2
  [ "$1" = chain ] && primary="flannel $("$BIN/flanneld" --version 2>&1 | head -1)"
  k8s=$(kubectl version -o json 2>/dev/null | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | tail -1)
  rt="containerd $("$CONTAINERD" --version | awk '{print $3}'), runc $(runc --version | sed -n 's/^runc version //p')"
  [ -f "$E2E_RECORD" ] || printf 'date\tcommit\tkubernetes\truntime\tcgroup\tkernel\tfamilies\ttopology\tproxy\tmode\tprimary\tcommand\tresult\tseconds\n' >"$E2E_RECORD"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%F)" \
    "$(git -C "$REPO" describe --always --dirty 2>/dev/null)" "${k8s:-$K8S_VERSION}" "$rt" "$cg" "$(uname -r)" \
    "$IP_FAMILY" "$TOPOLOGY" "$(sed -n 's/^mode: //p' "$ETC/kube-proxy.yaml" 2>/dev/null)" "$1" "$primary" \
    "$(env | grep -E '^(K8S_LAB_[A-Z0-9_]+|E2E_MODES|E2E_RUN|E2E_CHURN)=' | sort | sed "s/=\(.*\)/='\1'/" | tr '\n' ' ')hack/k8s/e2e.sh" \
    "$2" "$3" >>"$E2E_RECORD"
}

# up.sh is idempotent: on a running cluster it only starts what is missing
# (node 2, CoreDNS) in a few seconds.
"$LAB/up.sh" || { rc=1; log "cluster did not come up"; exit; }
# The containerd up.sh started (lib/common.sh): its ctr for the tests, and
# E2E_CONTAINERD for what they expect of it (which cgroup source).
lab_containerd
export KUBECONFIG=$STATE/admin.kubeconfig CNI_USERNET_E2E=1 E2E_NODE1=$NODE E2E_CONTAINERD=$CONTAINERD_VARIANT
# (up.sh may have found a running cluster of other families than asked:
# the tests follow the cluster's)
lab_ip_family; lab_topology
export E2E_IP_FAMILY=$IP_FAMILY E2E_NODE2_IP6=${DUAL:+$NODE2_IP6} E2E_TOPOLOGY=$TOPOLOGY
log "IP families: $IP_FAMILY (pods $POD_NETS, Services $SVC_CIDRS); nodes: $TOPOLOGY"
log "containerd: $("$CONTAINERD" --version)"
log "kube-proxy: mode $(sed -n 's/^mode: //p' "$ETC/kube-proxy.yaml" 2>/dev/null)"
hack/image.sh || { rc=1; exit; }
# TestKubernetesRelease installs, upgrades and uninstalls a release's chart
# package with it, as a user would.
make -s helm || { rc=1; exit; }
if [ "$K8S_LAB_NODES" = 2 ]; then
  # The README imports the image on this node; node 2 has a containerd of its own.
  export E2E_NODE2=$NODE2 E2E_NODE2_IP=$NODE2_IP E2E_NODE2_ROOT=$STATE/node2
  "$LAB/node2.sh" import bin/cni-usernet-image.tar || { rc=1; exit; }
fi
# Both modes on the one cluster: standalone first (the nodes start without a
# CNI; its test ends with the uninstall, leaving the nodes as they were), then
# flannel (flannel.sh) and cni-usernet chained behind it. E2E_MODES picks.
# In standalone mode the tests after TestKubernetes (go test runs them in
# file order) each install on the nodes it left and uninstall again; among
# them TestKubernetesRelease, a release as a user gets it (hack/release.sh's
# image and chart package).
modes=${E2E_MODES:-standalone chain}
[ "$K8S_LAB_NODES" = 2 ] || modes=standalone
for mode in $modes; do
  s=$(date +%s)
  case "$mode" in
    # (a cluster kept from a chained run: standalone starts without a CNI)
    # The kubelet notices the CNI configuration gone within seconds: the
    # test's first step wants the nodes NotReady.
    standalone) pid_alive flanneld && { "$LAB/flannel.sh" down
      ( wait_for "node $NODE NotReady without flannel" 60 sh -c \
        "! kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" ) || true; } ;;
    # Standalone's uninstall left the nodes without a CNI: flannel.sh waits
    # for Ready, which must not be the kubelet's report from before it.
    chain) pid_alive flanneld || for n in $NODE ${NODE2:-}; do
        ( wait_for "node $n NotReady before flannel" 60 sh -c \
          "! kubectl get node $n -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" ) || true
      done
      "$LAB/flannel.sh" up || { rc=1; log "flannel did not come up"; dump_logs; continue; } ;;
    *) log "E2E_MODES: unknown mode $mode"; rc=1; continue ;;
  esac
  log "---- test/e2e, $mode mode"
  result=pass
  E2E_MODE=$mode go test -count=1 -v -timeout 30m ./test/e2e ${E2E_RUN:+-run "$E2E_RUN"} || { rc=1; result=fail; dump_logs; }
  log "---- $mode mode: $(( $(date +%s) - s ))s$([ "$mode" = chain ] && echo ", flannel's start included")"
  record "$mode" "$result" $(( $(date +%s) - s ))
done

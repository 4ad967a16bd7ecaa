#!/bin/bash
# up.sh — build (once) and start a real single-node Kubernetes cluster on this
# machine: etcd + kube-apiserver + kube-controller-manager + kube-scheduler +
# kubelet + kube-proxy on containerd/runc, CNI from /opt/cni/bin and /etc/cni/net.d.
# Everything comes from Debian packages and the Go module proxy; no image pulls.
#
# Origin: the k8s-lab recipe (../shared/k8s-lab/setup.sh of this project's
# workspace), copied nearly verbatim so that CI needs nothing outside the
# repository. Changes: no default CNI unless asked (the node stays NotReady
# until cni-usernet's DaemonSet installs), kubectl built too, and what it adds
# to /opt/cni/bin and /etc/cni/net.d is recorded so that down.sh removes it.
#
# Idempotent: each step is skipped when its result is already there / running.
# Usage: hack/k8s/up.sh                   build what is missing, start everything
#        K8S_LAB_DEFAULT_CNI=1 hack/k8s/up.sh   also install a fallback ptp conflist
#                                                 (and smoke-test a pod on it)
#        K8S_LAB_CONTAINERD=1 hack/k8s/up.sh    Debian's containerd 1.6 on both nodes
#                                                 instead of containerd 2 (containerd2/go.mod)
#        K8S_LAB_KUBERNETES=1.35 hack/k8s/up.sh Kubernetes 1.35 (toolmod-1.35) instead of
#                                                 toolmod's 1.37 (fixed when the cluster is made)
#        K8S_LAB_PROXY_MODE=nftables hack/k8s/up.sh   kube-proxy in nftables mode on both
#                                                 nodes (default iptables; a running lab
#                                                 switches, see "kube-proxy" below)
#        K8S_LAB_IP_FAMILY=ipv4 hack/k8s/up.sh   IPv4 only (default dual: IPv4 and IPv6,
#                                                 lib/common.sh; fixed when the cluster is made)
# Afterwards:  export KUBECONFIG=/var/lib/k8s-lab/admin.kubeconfig PATH=/opt/k8s-lab/bin:$PATH
# Stop with hack/k8s/down.sh (restores the machine; built binaries stay in /opt/k8s-lab).
set -euo pipefail

LAB=$(cd "$(dirname "$0")" && pwd)
. "$LAB/lib/common.sh"
# kube-proxy's mode on both nodes. Not IPVS: it needs the kernel's ip_vs,
# which this machine kind's kernel lacks (no /proc/net/ip_vs, no modules
# to load), so the lab has never run it.
PROXY_MODE=${K8S_LAB_PROXY_MODE:-iptables}
case "$PROXY_MODE" in
  iptables | nftables) ;;
  ipvs) die "K8S_LAB_PROXY_MODE=ipvs: not on this lab, $([ -e /proc/net/ip_vs ] && echo "never tested here" || echo "the kernel has no IPVS (no /proc/net/ip_vs)")" ;;
  *) die "K8S_LAB_PROXY_MODE=$PROXY_MODE: iptables (the default) or nftables" ;;
esac
if [ "$PROXY_MODE" = nftables ]; then
  # (kube-proxy's own check is the kernel's version, 5.13; knftables runs
  # the nft binary, which must be 1.0.1 or later)
  command -v nft >/dev/null || die "kube-proxy's nftables mode needs the nft binary (Debian's nftables)"
fi

lab_lock
lab_ip_family   # (again: the lab we waited for may have been replaced)
if [ -n "${K8S_LAB_IP_FAMILY:-}" ] && [ -n "$IP_FAMILY_RUNNING" ] && [ "$K8S_LAB_IP_FAMILY" != "$IP_FAMILY_RUNNING" ]; then
  die "the lab's cluster is $IP_FAMILY_RUNNING, K8S_LAB_IP_FAMILY asks for $K8S_LAB_IP_FAMILY: hack/k8s/down.sh --purge first"
fi
echo "$IP_FAMILY" >"$IP_FAMILY_FILE"
# (the release a cluster was made with: lib/common.sh's K8S_LAB_KUBERNETES)
K8S_VERSION_FILE=$STATE/kubernetes-version
if [ -f "$K8S_VERSION_FILE" ] && [ "$(cat "$K8S_VERSION_FILE")" != "$K8S_VERSION" ]; then
  die "the lab's cluster is Kubernetes $(cat "$K8S_VERSION_FILE"), this run asks for $K8S_VERSION (K8S_LAB_KUBERNETES=${K8S_LAB_KUBERNETES:-}): hack/k8s/down.sh --purge first"
fi
echo "$K8S_VERSION" >"$K8S_VERSION_FILE"

t0=$(date +%s)
log "k8s-lab setup: Kubernetes $K8S_VERSION, node $NODE ($NODE_IP${DUAL:+, $NODE_IP6}), pods $POD_NETS, Services $SVC_CIDRS"

# ---------------------------------------------------------------- packages
need_pkgs=()
for p in containerd runc etcd-server containernetworking-plugins iptables conntrack socat openssl busybox-static gcc libc6-dev ethtool; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "apt-get install ${need_pkgs[*]}"
  apt-get update -q >/dev/null
  # Do not let package scripts start etcd/containerd services: we run our own.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >"$LOGDIR/apt.log" 2>&1 \
    || { [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get failed, see $LOGDIR/apt.log"; }
  [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
# Debian's etcd package may have started its own etcd (only where a service manager runs).
if pgrep -x etcd >/dev/null && ! pid_alive etcd; then
  die "an etcd not started by k8s-lab is running (pid $(pgrep -x etcd | head -1)); stop it first"
fi

# ---------------------------------------------------------------- binaries
if [ -n "${K8S_LAB_CONTAINERD:-}" ] && [ "$K8S_LAB_CONTAINERD" != "$CONTAINERD_VARIANT" ]; then
  die "the running lab has containerd $CONTAINERD_VARIANT, K8S_LAB_CONTAINERD asks for $K8S_LAB_CONTAINERD: hack/k8s/down.sh first"
fi
"$LAB/lib/build.sh"

# ---------------------------------------------------------------- images
"$LAB/images/build-images.sh"

# ---------------------------------------------------------------- host network
# NODE_IP lives on lo: a node address that is not loopback (the apiserver refuses
# 127/8 as the kubernetes Service endpoint) and never leaves this machine.
# (replace, not add: idempotent on a running cluster, where `ip addr show |
# grep -q` under pipefail fails when grep's early exit kills ip's next write)
ip addr replace "$NODE_IP/32" dev lo
save_sysctls
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
if [ -n "$DUAL" ]; then
  ip -6 addr replace "$NODE_IP6/128" dev lo
  sysctl -qw net.ipv6.conf.all.forwarding=1
fi
# The guard: no lab traffic leaves this machine, in either family (this
# machine kind's eth0 may have an IPv6 default route too).
# - K8S-LAB-GUARD, first in FORWARD: what this host forwards, node 2's own
#   traffic and every pod's. Anything for a lab range (nodes, router
#   links, pods, Services) that would leave by a default route's device is
#   refused: a request to a Service's ClusterIP that no kube-proxy
#   translates (the Service is gone; upstream's Services specs curl one
#   from a hostNetwork pod) would otherwise follow the default route. And
#   pod-network traffic may only go to the pod network (or this host,
#   which is INPUT, not FORWARD), or to node 2 over the lab's own link.
# - K8S-LAB-GUARD-OUT, first in OUTPUT: this node's own traffic (its
#   processes, hostNetwork pods), for the Service ranges only, whatever
#   the device. In OUTPUT `-o` is the device routed to before kube-proxy's
#   DNAT, while `-d` is the address after it: a rule on the pod or node
#   ranges leaving by eth0 would also refuse every translated request (the
#   kubernetes Service, translated to the API server on lo, was routed to
#   eth0 first) and stop the agents. A Service address still in `-d` is one
#   no kube-proxy rule translated, which has nowhere to go but out.
# down.sh checks that both were still in place at the end.
guard() { # IPT DEVICES RANGES SVC POD_NET NODE2_ADDR
  local ipt=$1 devs=$2 nets=$3 svc=$4 pods=$5 node2=$6 dev net
  for c in K8S-LAB-GUARD K8S-LAB-GUARD-OUT; do
    $ipt -w -S "$c" >/dev/null 2>&1 || $ipt -w -N "$c"
    $ipt -w -F "$c"
  done
  $ipt -w -C FORWARD -j K8S-LAB-GUARD 2>/dev/null || $ipt -w -I FORWARD 1 -j K8S-LAB-GUARD
  $ipt -w -C OUTPUT -j K8S-LAB-GUARD-OUT 2>/dev/null || $ipt -w -I OUTPUT 1 -j K8S-LAB-GUARD-OUT
  for dev in $devs; do
    for net in $nets; do $ipt -w -A K8S-LAB-GUARD -d "$net" -o "$dev" -j REJECT; done
  done
  $ipt -w -A K8S-LAB-GUARD-OUT -d "$svc" -j REJECT
  # (node 2's address, only over the lab's own link to it, for NodePorts there)
  $ipt -w -A K8S-LAB-GUARD -s "$pods" -d "$node2" -o k8slab-n2 -j RETURN
  $ipt -w -A K8S-LAB-GUARD -s "$pods" ! -d "$pods" -j DROP
}
default_devs() { # -4|-6: the devices of this machine's default routes
  ip "$1" route show default | sed -n 's/.* dev \([^ ]*\).*/\1/p' | sort -u | tr '\n' ' '
}
guard iptables "$(default_devs -4)" "$LAB_NETS" "$SVC_CIDR" "$POD_NET" "$NODE2_IP"
[ -n "$DUAL" ] && guard ip6tables "$(default_devs -6)" "$LAB_NETS6" "$SVC_CIDR6" "$POD_NET6" "$NODE2_IP6"

# Pods' network namespaces (/run/netns) must be on a shared mount for a
# DaemonSet to mount them with HostToContainer propagation (cni-usernet's
# agent does); systemd hosts have / shared, this machine kind may not. Do what
# `ip netns add` does: bind /run/netns onto itself and make it shared.
mkdir -p /run/netns
if ! grep -qE '^[0-9]+ [0-9]+ [^ ]+ [^ ]+ /run/netns [^-]* shared:' /proc/self/mountinfo; then
  if ! grep -qE '^[0-9]+ [0-9]+ [^ ]+ [^ ]+ /run/netns ' /proc/self/mountinfo; then
    mount --bind /run/netns /run/netns
    echo mounted >"$STATE/netns-mount"
  fi
  mount --make-shared /run/netns
fi

# ---------------------------------------------------------------- PKI + kubeconfigs
"$LAB/lib/pki.sh" "$PKI" "$NODE" "$NODE_IP" "$SVC_IP"
for u in admin kubelet kube-controller-manager kube-scheduler kube-proxy; do
  write_kubeconfig "$u" "$STATE/$u.kubeconfig"
done

# ---------------------------------------------------------------- CNI
# Snapshot the CNI directories once, before the first change, so that down.sh
# can put them back as they were (files added since are removed, changed ones
# reported): the Debian plugins copied below, and anything an installer under
# test leaves behind.
if [ ! -f "$STATE/cni-before" ]; then
  {
    for d in /opt/cni /opt/cni/bin /etc/cni /etc/cni/net.d /var/lib/cni \
             /var/lib/cni-usernet /run/cni-usernet /var/log/cni-usernet; do
      [ -e "$d" ] || echo "absent $d"
    done
    for d in /opt/cni/bin /etc/cni/net.d; do
      [ -d "$d" ] && find "$d" -type f -exec sha256sum {} + | sed 's/^/file /'
    done
  } >"$STATE/cni-before.tmp"
  mv "$STATE/cni-before.tmp" "$STATE/cni-before"
fi
mkdir -p /opt/cni/bin /etc/cni/net.d
for f in /usr/lib/cni/*; do
  [ -e "/opt/cni/bin/$(basename "$f")" ] || cp -a "$f" /opt/cni/bin/
done
if [ "${K8S_LAB_DEFAULT_CNI:-0}" = 1 ]; then
  # Fallback network (lowest priority name): veth point-to-point + host-local IPAM.
  cat >/etc/cni/net.d/99-k8s-lab-ptp.conflist <<EOF
{
  "cniVersion": "0.4.0",
  "name": "k8s-lab",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "/var/lib/cni/networks"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
fi

# ---------------------------------------------------------------- containerd
mkdir -p "$ETC"
if [ "$CONTAINERD_VARIANT" = 2 ]; then
  # The configuration below in containerd 2's layout (version 3: the CRI
  # plugin split into io.containerd.cri.v1.runtime and .images; 2.3 and
  # later read it and migrate it in memory to their version 4, which only
  # turns [grpc] and the other server sections into plugins). Where
  # containerd 2's defaults differ from 1.6's they stay, as users get them
  # (unprivileged ports and ping in pods, CDI), except NRI: its socket
  # /var/run/nri/nri.sock would be shared by both nodes' containerds, and
  # 1.6 has none.
  cat >"$ETC/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.runtime']
  # (as below: this VM's root lacks CAP_SYS_RESOURCE)
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # the shim built with it, whatever the daemon's PATH (Debian's 1.6
      # one is in /usr/bin)
      runtime_path = "$CONTAINERD2_BIN/containerd-shim-runc-v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
EOF
else
  cat >"$ETC/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  # This VM's root lacks CAP_SYS_RESOURCE, so runc may not lower oom_score_adj
  # (pause asks for -998: "can't get final child's PID from pipe: EOF").
  # Only allow raising it, as rootless setups do.
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE_IMAGE"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
EOF
fi
cat >/etc/crictl.yaml <<EOF
runtime-endpoint: unix:///run/containerd/containerd.sock
image-endpoint: unix:///run/containerd/containerd.sock
timeout: 30
EOF
pid_alive containerd || echo "$CONTAINERD_VARIANT" >"$CONTAINERD_VARIANT_FILE"
start_daemon containerd "$CONTAINERD" --config "$ETC/containerd.toml"
wait_for "containerd" 60 ctr version
for t in "$IMGDIR"/*.tar; do
  ref=$(tar -xOf "$t" index.json | sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p')
  ctr -n k8s.io images ls -q | grep -qx "$ref" || ctr -n k8s.io images import "$t" >/dev/null
done
log "images: $(ctr -n k8s.io images ls -q | grep -v '^sha256' | tr '\n' ' ')"

# ---------------------------------------------------------------- etcd
start_daemon etcd /usr/bin/etcd --name k8s-lab --data-dir "$STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster k8s-lab=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
wait_for "etcd" 60 curl -fsS http://127.0.0.1:2379/health

# ---------------------------------------------------------------- control plane
start_apiserver
wait_for "kube-apiserver /readyz" 120 kubectl --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz
ta=$(date +%s)

# (the per-family mask flags are refused on a single-stack cluster, the
# single one on a dual-stack cluster)
node_cidr_masks=--node-cidr-mask-size=24
[ -n "$DUAL" ] && node_cidr_masks="--node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64"
start_daemon kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false \
  --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
  --use-service-account-credentials=true \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --allocate-node-cidrs=true --cluster-cidr="$POD_NETS" $node_cidr_masks \
  --service-cluster-ip-range="$SVC_CIDRS" --v=1
start_daemon kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$STATE/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --v=1

# ---------------------------------------------------------------- kubelet
cat >"$ETC/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
cgroupDriver: cgroupfs
failCgroupV1: false   # this machine's cgroups are v1, which 1.35 and later refuse unless told
failSwapOn: false
oomScoreAdj: 0   # -999 (default) needs CAP_SYS_RESOURCE, which this VM's root lacks
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $ETC/resolv.conf
maxPods: 250   # the policy propagation check runs 200 pods across the two nodes
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
EOF
# Pods get a resolver inside the cluster range only (no DNS traffic leaves the machine).
echo "nameserver $DNS_IP" >"$ETC/resolv.conf"
mkdir -p /var/lib/kubelet
start_daemon kubelet "$BIN/kubelet" \
  --config="$ETC/kubelet.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
  --hostname-override="$NODE" --node-ip="$NODE_IP${DUAL:+,$NODE_IP6}" --v=1

# ---------------------------------------------------------------- kube-proxy
if [ -x "$BIN/kube-proxy" ]; then
  # Replaced only when it changes: kube-proxy exits when its configuration
  # file is written to, and a running one would be left dead behind
  # start_daemon's "already running". When it changes (K8S_LAB_PROXY_MODE
  # on a running lab) the running one is stopped first; the new one
  # removes the other mode's rules as it starts (kube-proxy's
  # platformCleanup: iptables' and IPVS' when in nftables mode, the
  # kube-proxy nft tables when in iptables mode). node2.sh does the same
  # with node 2's copy.
  node_port_addrs="\"$NODE_IP/32\""
  [ -n "$DUAL" ] && node_port_addrs="$node_port_addrs, \"$NODE_IP6/128\""
  cat >"$ETC/kube-proxy.yaml.new" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: $PROXY_MODE
clusterCIDR: $POD_NETS
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [$node_port_addrs]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}   # leave host conntrack sysctls alone
oomScoreAdj: 0
EOF
  if ! cmp -s "$ETC/kube-proxy.yaml.new" "$ETC/kube-proxy.yaml"; then
    [ -f "$ETC/kube-proxy.yaml" ] && log "kube-proxy's configuration changed (mode $PROXY_MODE): restarting it"
    stop_daemon kube-proxy 20
  fi
  replace_if_changed "$ETC/kube-proxy.yaml.new" "$ETC/kube-proxy.yaml"
  start_daemon kube-proxy "$BIN/kube-proxy" --config="$ETC/kube-proxy.yaml" --v=1
fi

export KUBECONFIG="$STATE/admin.kubeconfig"
# ---------------------------------------------------------------- node 2
if [ "$K8S_LAB_NODES" = 2 ]; then
  wait_for "node $NODE registered" 180 kubectl get node "$NODE"   # node 1 gets the first pod CIDR
  "$LAB/node2.sh" up
fi

# ---------------------------------------------------------------- cluster DNS
# CoreDNS (built from its Go module, lib/build.sh) on the kubelets' clusterDNS
# address; its pods start once a CNI plugin gives the nodes a network.
sed -e "s#@DNS_IP@#$DNS_IP#g" -e "s#@COREDNS_IMAGE@#$COREDNS_IMAGE#g" "$LAB/coredns.yaml" | kubectl apply -f - >/dev/null
log "CoreDNS applied (Service kube-dns at $DNS_IP)"

if ls /etc/cni/net.d/*.conf* >/dev/null 2>&1; then
  wait_for "node $NODE Ready" 180 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' 2>/dev/null | grep -qx True"
else
  # No CNI config yet: the node registers but stays NotReady until a CNI
  # installer (e.g. a DaemonSet with hostNetwork) writes one.
  wait_for "node $NODE registered" 180 kubectl get node "$NODE"
  log "no CNI config in /etc/cni/net.d: node stays NotReady until a CNI plugin is installed"
  K8S_LAB_SKIP_SMOKE=1
fi
wait_for "default service account" 60 kubectl -n default get serviceaccount default
tr=$(date +%s)
log "cluster up: apiserver ready after $((ta - t0))s, node up after $((tr - t0))s (whole script so far)"
kubectl get nodes -o wide

# ---------------------------------------------------------------- smoke test
# (only on the fallback network: a smoke pod must not be the first pod of the
# plugin under test)
if [ "${K8S_LAB_SKIP_SMOKE:-0}" != 1 ] && [ "${K8S_LAB_DEFAULT_CNI:-0}" = 1 ]; then
  kubectl delete pod k8s-lab-smoke --ignore-not-found --wait=true >/dev/null
  kubectl run k8s-lab-smoke --image="$BUSYBOX_IMAGE" --image-pull-policy=Never --restart=Never \
    --command -- sh -c 'ip -4 addr show eth0; ip route; sleep 3600' >/dev/null
  kubectl wait --for=condition=Ready pod/k8s-lab-smoke --timeout=120s >/dev/null
  ip=$(kubectl get pod k8s-lab-smoke -o jsonpath='{.status.podIP}')
  log "smoke pod Ready with IP $ip"
  kubectl exec k8s-lab-smoke -- ping -c1 -W2 "$NODE_IP" >/dev/null && log "pod -> node $NODE_IP ping ok"
  busybox ping -c1 -W2 "$ip" >/dev/null && log "node -> pod $ip ping ok"
  kubectl delete pod k8s-lab-smoke --wait=false >/dev/null
fi
log "done in $(( $(date +%s) - t0 ))s.  export KUBECONFIG=$STATE/admin.kubeconfig"

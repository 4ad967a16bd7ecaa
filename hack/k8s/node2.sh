#!/bin/bash
# node2.sh — the lab's second node, on the same machine: its own kubelet,
# containerd and kube-proxy in namespaces of their own, joined to the first
# node (the machine's root namespaces) by one veth.
#
#   hack/k8s/node2.sh up            start it (up.sh calls this once the control plane runs)
#   hack/k8s/node2.sh down          stop it and remove its namespaces, link and files (down.sh calls this)
#   hack/k8s/node2.sh exec CMD...   run CMD on node 2 (its network, mount, PID and UTS namespaces)
#   hack/k8s/node2.sh import TAR    import an OCI image tarball into node 2's containerd
#   hack/k8s/node2.sh daemon NAME CMD...  start a daemon on node 2 (pid file NAME, log NAME.log;
#                                   flannel.sh's flanneld)
#   hack/k8s/node2.sh restart-containerd  stop node 2's containerd and start it again (shims,
#                                   containers and pods' namespaces live on, as on a real node)
#   hack/k8s/node2.sh reboot        what a reboot does to node 2, then its daemons again (below)
#
# What node 2 has of its own (everything a CNI plugin or a kubelet writes):
#   network namespace   eth0 = 10.242.0.2/32 (and fd10:242::2/128 when the lab is dual-stack),
#                       peer of k8slab-n2 in the root namespace; its own
#                       iptables (kube-proxy, the guard), routes, conntrack, sysctls, abstract sockets
#   mount namespace     private bind mounts over /etc/cni/net.d, /opt/cni/bin, /var/lib/cni,
#                       /var/lib/cni-usernet, /run/cni-usernet, /var/log/cni-usernet,
#                       /var/lib/kubelet, /var/lib/containerd, /run/containerd, /run/netns,
#                       /var/log/pods, /var/log/containers, /run/flannel (backed by $STATE/node2/...)
#   PID namespace       a reaping init (the lab's pause) as PID 1: hostPID pods (cni-usernet's
#                       agent) see node 2's processes, /proc/1/ns/mnt is node 2's mount namespace
#   UTS namespace       host name = the node name
#   cgroups             kubelet's cgroupRoot /k8s-lab-node2 (node 1's pods are under /kubepods)
# What it shares with node 1: the kernel (modules, sysctls that are not per
# namespace, nftables netdev support), the root file system outside those
# directories (binaries in /opt/k8s-lab, /usr, /etc), the cgroup hierarchy (a
# subtree of its own), the control plane (etcd, API server, controller manager,
# scheduler run once, on node 1), the CA and the kube-proxy credentials.
set -euo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
. "$LAB/lib/common.sh"

N2=$STATE/node2 # node 2's private directories
N2_PIDFILE=$RUNDIR/node2-init.pid
N2_CGROUP=k8s-lab-node2
N2_PRIVATE="/etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/cni-usernet /run/cni-usernet /var/log/cni-usernet
  /var/lib/kubelet /var/lib/containerd /run/containerd /run/netns /var/log/pods /var/log/containers
  /run/flannel"

n2_pid() { [ -f "$N2_PIDFILE" ] && kill -0 "$(cat "$N2_PIDFILE")" 2>/dev/null && cat "$N2_PIDFILE"; }

# in_n2 CMD...: run in node 2's namespaces (-F: no fork into the PID ns is
# needed for short commands, but daemons must be in it: nsenter forks with -p).
in_n2() {
  local pid; pid=$(n2_pid) || die "node 2 is not running"
  nsenter -t "$pid" -n -m -p -u -- "$@"
}

n2_start_daemon() { # NAME CMD...
  local name=$1; shift
  if pid_alive "$name"; then return 0; fi
  log "starting $name on $NODE2"
  local pid ns child i; pid=$(n2_pid)
  # nsenter forks the daemon into node 2's PID namespace and waits for it:
  # record the daemon itself, so that stop_daemon signals it, not nsenter.
  (without_fds setsid nsenter -t "$pid" -n -m -p -u -- "$@") >>"$LOGDIR/$name.log" 2>&1 </dev/null &
  ns=$!
  for i in $(seq 50); do
    child=$(pgrep -P "$ns" 2>/dev/null | head -1 || true)
    [ -n "$child" ] && break
    sleep 0.1
  done
  [ -n "$child" ] || die "$name did not start: $(tail -5 "$LOGDIR/$name.log")"
  echo "$child" >"$RUNDIR/$name.pid"
  sleep 0.5
  pid_alive "$name" || die "$name exited at once: $(tail -5 "$LOGDIR/$name.log")"
}

# start_init PIDFILE WHAT UNSHARE_ARGS...: start the lab's init in new
# namespaces (unshare UNSHARE_ARGS, which ends in exec'ing the init) and
# record its PID in the root namespace, the child of unshare, in PIDFILE
# (its log beside the other daemons', named after PIDFILE).
start_init() {
  local pidfile=$1 what=$2 log; shift 2
  log=$LOGDIR/$(basename "$pidfile" .pid).log
  # (without_fds: the init lives on after this script, and must not keep
  # the lab's lock, whatever descriptor holds it)
  (without_fds setsid unshare "$@") >>"$log" 2>&1 </dev/null &
  local i child
  for i in $(seq 50); do
    child=$(pgrep -P $! 2>/dev/null | head -1 || true)
    if [ -n "$child" ] && [ "$(readlink /proc/$child/exe 2>/dev/null)" = "$BIN/k8s-lab-init" ]; then
      echo "$child" >"$pidfile"; return 0
    fi
    sleep 0.1
  done
  die "$what's init did not start: $(tail -5 "$log")"
}

# The router of K8S_LAB_TOPOLOGY=routed: a network namespace held by an
# init of its own, with one link to each node (n1: k8slab-n2's peer, n2:
# node 2's eth0's). It routes the nodes' addresses and nothing else: it
# has no route to any pod CIDR, so pod traffic between the nodes crosses
# it only encapsulated.
router_pid() { [ -f "$ROUTER_PIDFILE" ] && kill -0 "$(cat "$ROUTER_PIDFILE")" 2>/dev/null && cat "$ROUTER_PIDFILE"; }
in_router() {
  local pid; pid=$(router_pid) || die "the router is not running"
  nsenter -t "$pid" -n -- "$@"
}

router_up() { # NODE2_PID
  if ! router_pid >/dev/null; then
    log "creating the router between the nodes (K8S_LAB_TOPOLOGY=routed)"
    start_init "$ROUTER_PIDFILE" "the router" --net --fork "$BIN/k8s-lab-init"
  fi
  local rpid; rpid=$(router_pid)
  ip link show k8slab-n2 >/dev/null 2>&1 || ip link add k8slab-n2 type veth peer name n1 netns "$rpid"
  in_router ip link show n2 >/dev/null 2>&1 || in_router ip link add n2 type veth peer name eth0 netns "$1"
  in_router sh -ec "
    ip link set lo up; ip link set n1 up; ip link set n2 up
    ip addr replace $RT_N1/32 dev n1; ip addr replace $RT_N2/32 dev n2
    ip route replace $NODE_IP/32 dev n1; ip route replace $NODE2_IP/32 dev n2
    sysctl -qw net.ipv4.ip_forward=1"
  if [ -n "$DUAL" ]; then
    in_router sh -ec "
      ip -6 addr replace $RT6_N1/128 dev n1 nodad; ip -6 addr replace $RT6_N2/128 dev n2 nodad
      ip -6 route replace $NODE_IP6/128 dev n1; ip -6 route replace $NODE2_IP6/128 dev n2
      sysctl -qw net.ipv6.conf.all.forwarding=1"
  fi
}

router_down() {
  local pid; pid=$(router_pid || true)
  if [ -n "$pid" ]; then
    # its links go with its network namespace, with its init
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$ROUTER_PIDFILE"
}

up() {
  local t0; t0=$(date +%s)
  # ------------------------------------------------------------ namespaces
  if ! n2_pid >/dev/null; then
    log "creating node $NODE2 (network, mount, PID and UTS namespaces)"
    mkdir -p "$N2"
    for d in $N2_PRIVATE; do mkdir -p "$d" "$N2/$(echo "${d#/}" | tr / _)"; done
    [ -x "$BIN/k8s-lab-init" ] || gcc -static -Os -s -o "$BIN/k8s-lab-init" "$LAB/images/pause.c"
    local mounts="set -e; mount --make-rprivate /"
    # (first away with the copies of node 1's mounts there, e.g. its shared
    # /run/netns: a check of the path would find them under ours)
    for d in $N2_PRIVATE; do
      mounts="$mounts; while mountpoint -q $d; do umount -l $d; done; mount --bind $N2/$(echo "${d#/}" | tr / _) $d"
    done
    # pods' namespaces: a shared mount, for the agent's HostToContainer volume
    mounts="$mounts; mount --make-shared /run/netns; hostname $NODE2"
    start_init "$N2_PIDFILE" "node 2" --net --mount --pid --uts --fork --mount-proc --propagation private \
      sh -c "$mounts; exec $BIN/k8s-lab-init"
  fi
  local pid; pid=$(n2_pid)

  # ------------------------------------------------------------ the link
  # (lib/common.sh's K8S_LAB_TOPOLOGY: one link, or a router between)
  if [ -n "${K8S_LAB_TOPOLOGY:-}" ] && [ -n "$TOPOLOGY_RUNNING" ] && [ "$K8S_LAB_TOPOLOGY" != "$TOPOLOGY_RUNNING" ]; then
    die "node 2 is connected $TOPOLOGY_RUNNING, K8S_LAB_TOPOLOGY asks for $K8S_LAB_TOPOLOGY: hack/k8s/down.sh first"
  fi
  echo "$TOPOLOGY" >"$TOPOLOGY_FILE"
  # each node's next hop to the other: the other node itself, or the router
  local hop1=$NODE2_IP hop2=$NODE_IP hop61=$NODE2_IP6 hop62=$NODE_IP6
  if [ "$TOPOLOGY" = routed ]; then
    router_up "$pid"
    hop1=$RT_N1 hop2=$RT_N2 hop61=$RT6_N1 hop62=$RT6_N2
  elif ! ip link show k8slab-n2 >/dev/null 2>&1; then
    ip link add k8slab-n2 type veth peer name eth0 netns "$pid"
  fi
  ip link set k8slab-n2 up
  ip route replace "$hop1/32" dev k8slab-n2 src "$NODE_IP"
  [ "$hop1" = "$NODE2_IP" ] || ip route replace "$NODE2_IP/32" via "$hop1" dev k8slab-n2 src "$NODE_IP"
  in_n2 sh -ec "
    ip link set lo up; ip link set eth0 up
    ip addr replace $NODE2_IP/32 dev eth0
    ip route replace $hop2/32 dev eth0 src $NODE2_IP
    [ $hop2 = $NODE_IP ] || ip route replace $NODE_IP/32 via $hop2 dev eth0 src $NODE2_IP
    # host processes' Service traffic (kube-proxy DNATs it in OUTPUT after this lookup)
    ip route replace $SVC_CIDR via $hop2 dev eth0 src $NODE2_IP
    sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.route_localnet=0
    sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
    iptables -w -N K8S-LAB-GUARD 2>/dev/null || true
    iptables -w -C FORWARD -j K8S-LAB-GUARD 2>/dev/null || iptables -w -I FORWARD 1 -j K8S-LAB-GUARD
    iptables -w -F K8S-LAB-GUARD
    iptables -w -A K8S-LAB-GUARD -s $POD_NET -d $NODE_NET -o eth0 -j RETURN
    iptables -w -A K8S-LAB-GUARD -s $POD_NET ! -d $POD_NET -j DROP"
  wait_for "node 2 reaching $NODE_IP ($TOPOLOGY)" 10 in_n2 ping -c1 -W1 "$NODE_IP"
  if [ -n "$DUAL" ]; then
    # (nodad: the addresses are usable at once, and no other host shares the link)
    ip -6 route replace "$hop61/128" dev k8slab-n2 src "$NODE_IP6"
    [ "$hop61" = "$NODE2_IP6" ] || ip -6 route replace "$NODE2_IP6/128" via "$hop61" dev k8slab-n2 src "$NODE_IP6"
    # Node 1's IPv6 address is on lo, and unlike ARP, neighbour discovery
    # answers only for addresses of the link asked on: proxy it there (at
    # once, not after the default random delay of up to 0.8 s).
    sysctl -qw net.ipv6.conf.k8slab-n2.proxy_ndp=1 net.ipv6.neigh.k8slab-n2.proxy_delay=0
    ip -6 neigh replace proxy "$NODE_IP6" dev k8slab-n2
    in_n2 sh -ec "
      ip -6 addr replace $NODE2_IP6/128 dev eth0 nodad
      ip -6 route replace $hop62/128 dev eth0 src $NODE2_IP6
      [ $hop62 = $NODE_IP6 ] || ip -6 route replace $NODE_IP6/128 via $hop62 dev eth0 src $NODE2_IP6
      ip -6 route replace $SVC_CIDR6 via $hop62 dev eth0 src $NODE2_IP6
      sysctl -qw net.ipv6.conf.all.forwarding=1
      ip6tables -w -N K8S-LAB-GUARD 2>/dev/null || true
      ip6tables -w -C FORWARD -j K8S-LAB-GUARD 2>/dev/null || ip6tables -w -I FORWARD 1 -j K8S-LAB-GUARD
      ip6tables -w -F K8S-LAB-GUARD
      ip6tables -w -A K8S-LAB-GUARD -s $POD_NET6 -d $NODE_IP6 -o eth0 -j RETURN
      ip6tables -w -A K8S-LAB-GUARD -s $POD_NET6 ! -d $POD_NET6 -j DROP"
    wait_for "node 2 reaching $NODE_IP6 ($TOPOLOGY)" 10 in_n2 ping -6 -c1 -W1 "$NODE_IP6"
  fi

  # ------------------------------------------------------------ CNI plugins, cgroups, certificates
  for f in /usr/lib/cni/*; do
    [ -e "$N2/opt_cni_bin/$(basename "$f")" ] || cp -a "$f" "$N2/opt_cni_bin/"
  done
  for c in /sys/fs/cgroup/*/; do
    [ -d "$c" ] && [ -w "$c" ] && mkdir -p "$c$N2_CGROUP" 2>/dev/null || true
  done
  (
    cd "$PKI"; umask 077
    cert() { # NAME SUBJECT EXTKEYUSAGE [SANS]  (as lib/pki.sh)
      [ -f "$1.crt" ] && return 0
      openssl genrsa -out "$1.key" 2048 2>/dev/null
      { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$3"; [ -n "${4:-}" ] && echo "subjectAltName=$4"; } >"$1.ext"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    cert "kubelet-$NODE2" "/O=system:nodes/CN=system:node:$NODE2" clientAuth
    cert "kubelet-serving-$NODE2" "/CN=$NODE2" serverAuth "DNS:$NODE2,IP:$NODE2_IP,IP:$NODE2_IP6"
  )
  write_kubeconfig "kubelet-$NODE2" "$STATE/kubelet-$NODE2.kubeconfig"

  # ------------------------------------------------------------ containerd
  # the same containerd and configuration as node 1's (lib/common.sh's
  # K8S_LAB_CONTAINERD): its paths are node 2's own through the bind mounts
  n2_start_daemon containerd-node2 "$CONTAINERD" --config "$ETC/containerd.toml"
  wait_for "containerd on $NODE2" 60 in_n2 ctr version
  for t in "$IMGDIR"/*.tar; do import "$t"; done

  # ------------------------------------------------------------ kubelet
  sed -e "s#^address: .*#address: $NODE2_IP#" \
      -e "s#^tlsCertFile: .*#tlsCertFile: $PKI/kubelet-serving-$NODE2.crt#" \
      -e "s#^tlsPrivateKeyFile: .*#tlsPrivateKeyFile: $PKI/kubelet-serving-$NODE2.key#" \
      "$ETC/kubelet.yaml" >"$ETC/kubelet-$NODE2.yaml"
  echo "cgroupRoot: /$N2_CGROUP" >>"$ETC/kubelet-$NODE2.yaml"
  n2_start_daemon kubelet-node2 "$BIN/kubelet" \
    --config="$ETC/kubelet-$NODE2.yaml" --kubeconfig="$STATE/kubelet-$NODE2.kubeconfig" \
    --hostname-override="$NODE2" --node-ip="$NODE2_IP${DUAL:+,$NODE2_IP6}" --v=1

  # ------------------------------------------------------------ kube-proxy
  sed -e "s#^hostnameOverride: .*#hostnameOverride: $NODE2#" \
      -e "s#^bindAddress: .*#bindAddress: $NODE2_IP#" \
      -e "s#^nodePortAddresses: .*#nodePortAddresses: [\"$NODE2_IP/32\"${DUAL:+, \"$NODE2_IP6/128\"}]#" \
      "$ETC/kube-proxy.yaml" >"$ETC/kube-proxy-$NODE2.yaml.new"
  # (a changed file, such as up.sh's K8S_LAB_PROXY_MODE on a running lab:
  # the running one stopped first, as up.sh does on node 1)
  cmp -s "$ETC/kube-proxy-$NODE2.yaml.new" "$ETC/kube-proxy-$NODE2.yaml" || stop_daemon kube-proxy-node2 20
  replace_if_changed "$ETC/kube-proxy-$NODE2.yaml.new" "$ETC/kube-proxy-$NODE2.yaml"
  n2_start_daemon kube-proxy-node2 "$BIN/kube-proxy" --config="$ETC/kube-proxy-$NODE2.yaml" --v=1

  wait_for "node $NODE2 registered" 180 kubectl --kubeconfig "$STATE/admin.kubeconfig" get node "$NODE2"
  log "node $NODE2 up in $(( $(date +%s) - t0 ))s"
}

# import skips only an image node 2 has with the same reference and the
# same manifest digest: a rebuilt image keeps its tag (localhost/...:dev)
# and must replace the old one, or node 2 runs stale code.
import() { # TAR
  local ref digest index tar; tar=$(realpath "$1")   # node 2's mount namespace starts in /
  index=$(tar -xOf "$tar" index.json)
  ref=$(sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p' <<<"$index")
  digest=$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' <<<"$index")
  in_n2 ctr -n k8s.io images ls | awk -v r="$ref" -v d="$digest" '$1 == r && $3 == d { f = 1 } END { exit !f }' ||
    in_n2 ctr -n k8s.io images import "$tar" >/dev/null
}

down() {
  local pid; pid=$(n2_pid || true)
  stop_daemon kubelet-node2 30
  if [ -n "$pid" ]; then
    # pod sandboxes: StopPodSandbox runs CNI DEL (node 2's plugin and files)
    if pid_alive containerd-node2; then
      for p in $(in_n2 crictl pods -q 2>/dev/null); do
        out=$(in_n2 crictl stopp "$p" 2>&1) || log "node 2: stopp $p failed: ${out##*desc = }"
        in_n2 crictl rmp -f "$p" >/dev/null 2>&1 || true
      done
    fi
    # node 2's cni-usernet stacks that outlived their pods (a failed run):
    # every process in node 2's PID namespace goes with its init below.
  fi
  stop_daemon kube-proxy-node2 20
  stop_daemon flanneld-node2 20
  stop_daemon containerd-node2 30
  if [ -n "$pid" ]; then
    # PID 1 of node 2 exits on SIGTERM: the kernel kills every process left
    # in its PID namespace (shims, stacks); its mount namespace and the
    # mounts in it go with the last of them, its network namespace (eth0,
    # and so k8slab-n2) with the last reference.
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$N2_PIDFILE"
  for _ in $(seq 20); do ip link show k8slab-n2 >/dev/null 2>&1 || break; sleep 0.25; done
  ip link del k8slab-n2 2>/dev/null || true
  router_down
  rm -f "$TOPOLOGY_FILE"
  ip route del "$NODE2_IP/32" 2>/dev/null || true
  ip -6 route del "$NODE2_IP6/128" 2>/dev/null || true
  # our routes to node 2's pods (cni-usernet's agent removes them on uninstall;
  # a failed run may leave them): protocol 117 is pkg/agent/noderoutes'.
  ip route flush proto 117 2>/dev/null || true
  for c in /sys/fs/cgroup/*/"$N2_CGROUP"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  kubectl --kubeconfig "$STATE/admin.kubeconfig" delete node "$NODE2" --wait=false >/dev/null 2>&1 || true
  rm -rf "$N2"
}

# reboot: what a node's reboot takes, on node 2. Stopped: kubelet and
# containerd; killed: every other process of the node (shims, containers,
# cni-usernet's stacks and agent), so the pods' network namespaces, their
# veths and the routes to them go; emptied: what lives on tmpfs on a real
# node (/run/containerd, /run/netns, /run/cni-usernet, the kubelet's volume
# mounts), the routes the agent made (protocol 117) and the node's
# cgroups. Kept: what is on
# disk (/var/lib/cni's leases, /var/lib/cni-usernet's state files,
# /var/lib/kubelet, /var/lib/containerd, /etc/cni/net.d, /opt/cni/bin), and
# the node's own link and addresses (its "hardware"). kube-proxy and
# flanneld keep running: they rebuild their own state, which is not
# cni-usernet's. Then containerd and the kubelet start again, as at boot.
reboot() {
  local pid; pid=$(n2_pid) || die "node 2 is not running"
  local t0; t0=$(date +%s)
  log "rebooting $NODE2 (simulated)"
  stop_daemon kubelet-node2 30
  stop_daemon containerd-node2 30
  local pidns keep p left i
  pidns=$(readlink /proc/"$pid"/ns/pid)
  keep=" $pid $(cat "$RUNDIR/kube-proxy-node2.pid" 2>/dev/null || true) $(cat "$RUNDIR/flanneld-node2.pid" 2>/dev/null || true) "
  for i in $(seq 40); do
    left=0
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      case "$keep" in *" $p "*) continue ;; esac
      # (a zombie is dead already: its parent reaps it)
      [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] && continue
      # node 2's own processes, and its pods' (PID namespaces of their
      # own, in the kubelet's cgroup subtree)
      if [ "$(readlink /proc/"$p"/ns/pid 2>/dev/null)" = "$pidns" ] ||
         grep -q ":/$N2_CGROUP/" /proc/"$p"/cgroup 2>/dev/null; then
        kill -KILL "$p" 2>/dev/null && left=$((left + 1))
      fi
    done
    [ "$left" = 0 ] && break
    sleep 0.25
  done
  [ "$left" = 0 ] || die "reboot: $left processes of node 2 survive SIGKILL"
  # (a mount stacked on another is listed twice: the second umount of the
  # path finds nothing left, which is fine)
  in_n2 sh -c "awk '{print \$5}' /proc/self/mountinfo |
    grep -E '^/run/(containerd|netns|cni-usernet)/.|^/var/lib/kubelet/pods/' | sort -r |
    while read -r m; do umount -l \"\$m\" 2>/dev/null || ! mountpoint -q \"\$m\" || exit 1; done"
  rm -rf "$N2"/run_containerd/* "$N2"/run_netns/* "$N2"/run_cni-usernet/*
  in_n2 ip route flush proto 117
  in_n2 ip -6 route flush proto 117
  # cgroups do not survive a reboot either: left behind, the kubelet's
  # cAdvisor spends about 50 s at its start on the dead containers' ones
  for c in /sys/fs/cgroup/*/"$N2_CGROUP"; do
    [ -d "$c" ] && find "$c" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  log "node 2 down like after a power cut ($(( $(date +%s) - t0 ))s); booting"
  up
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  exec) shift; in_n2 "$@" ;;
  import) shift; for t in "$@"; do import "$t"; done ;;
  daemon) shift; n2_pid >/dev/null || die "node 2 is not running"; n2_start_daemon "$@" ;;
  restart-containerd) n2_pid >/dev/null || die "node 2 is not running"; stop_daemon containerd-node2 30; up ;;
  reboot) reboot ;;
  *) echo "usage: $0 up|down|exec CMD...|import TAR...|daemon NAME CMD...|restart-containerd|reboot" >&2; exit 2 ;;
esac

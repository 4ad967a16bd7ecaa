#!/bin/bash
# apiserver.sh — take the lab's API server away and bring it back, for
# test/e2e's outages (TestKubernetesFaults):
#
#   hack/k8s/apiserver.sh stop    stop kube-apiserver (etcd and the rest keep running)
#   hack/k8s/apiserver.sh start   start it again and wait for /readyz (no-op when it runs)
set -euo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
. "$LAB/lib/common.sh"

case "${1:-}" in
  stop) stop_daemon kube-apiserver 30 ;;
  start)
    start_apiserver
    wait_for "kube-apiserver /readyz" 120 kubectl --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz ;;
  *) echo "usage: $0 stop|start" >&2; exit 2 ;;
esac

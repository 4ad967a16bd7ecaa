#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# cnp-conformance.sh — what `make e2e-cnp-conformance` runs: the upstream
# ClusterNetworkPolicy conformance suite (sigs.k8s.io/network-policy-api's
# conformance directory, at the version cnpconformance/go.mod pins, its
# ClusterNetworkPolicy profile) against cni-usernet in standalone mode on
# the lab. It brings the two-node cluster up (unless one is running),
# imports agnhost's image (images/build-images.sh agnhost) on both nodes,
# installs the suite's CRD from the module, installs cni-usernet with the
# README's standalone commands, runs the suite, writes its report to
# docs/conformance/clusternetworkpolicy-<version>-standalone-<families>.yaml
# (CNP_REPORT_DIR elsewhere) and the run's log beside the binaries
# (bin/), and tears the cluster down, also when something failed
# (E2E_KEEP_CLUSTER=1 keeps it). K8S_LAB_IP_FAMILY=ipv4 runs it on the
# IPv4-only cluster, and the other K8S_LAB_* of lib/common.sh apply;
# CNP_TIMEOUT is the suite's go test -timeout (60m; a run cut short
# writes no report, its log says how far it got).
# CNP_CHANNEL=experimental installs the module's experimental CRD instead
# of the standard one and claims the experimental features the agent
# implements (CNP_FEATURES, default ClusterNetworkPolicyNamedPorts); its
# report is clusternetworkpolicy-<version>-standalone-<families>-experimental.yaml.
# CNP_RUN narrows the suite to the tests whose names match (go test's
# -run below TestCNPConformance, e.g. CNP_RUN=NamedPort); the suite then
# reports the tests left out as passed, so that report goes to bin/.
# Not part of `make e2e`: the suite runs about half an hour on this lab.
# Exits non-zero when the suite failed or the run could not end.
set -uo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$LAB/../.." && pwd)
. "$LAB/lib/common.sh"
lab_lock
cd "$REPO"

rc=0
# The suite's namespaces before the purge: a run cut short leaves its
# StatefulSets, which would recreate the pods down.sh deletes.
delete_suite_namespaces() {
  kubectl delete ns -l conformance-house --wait=true --timeout=120s >/dev/null 2>&1 || true
}
lab_purge_at_exit delete_suite_namespaces

# The module's version and its files (the CRD), as cnpconformance/go.mod pins it.
npapi=$(cd "$LAB/cnpconformance" && go mod download -json sigs.k8s.io/network-policy-api) || { rc=1; exit; }
NPAPI_VERSION=$(sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p' <<<"$npapi")
NPAPI_DIR=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$npapi")
CHANNEL=${CNP_CHANNEL:-standard}
case "$CHANNEL" in
  standard) FEATURES=ClusterNetworkPolicy; SUFFIX= ;;
  experimental) FEATURES=ClusterNetworkPolicy,${CNP_FEATURES:-ClusterNetworkPolicyNamedPorts}; SUFFIX=-experimental ;;
  *) log "CNP_CHANNEL: standard or experimental, not $CHANNEL"; rc=1; exit ;;
esac
CRD=$NPAPI_DIR/config/crd/$CHANNEL/policy.networking.k8s.io_clusternetworkpolicies.yaml
[ -f "$CRD" ] || { log "no $CRD"; rc=1; exit; }

# What builds, before the cluster runs: agnhost's image, the suite's test
# binary, cni-usernet's image.
"$LAB/images/build-images.sh" agnhost || { rc=1; exit; }
mkdir -p bin
SUITE=$REPO/bin/cnpconformance.test
(cd "$LAB/cnpconformance" && nice -n 19 go test -c -o "$SUITE" .) || { rc=1; log "the suite's binary did not build"; exit; }
hack/image.sh || { rc=1; exit; }

"$LAB/up.sh" || { rc=1; log "cluster did not come up"; exit; }
lab_containerd
export KUBECONFIG=$STATE/admin.kubeconfig
lab_ip_family
log "IP families: $IP_FAMILY (pods $POD_NETS, Services $SVC_CIDRS)"
# A subset's report counts the tests it left out as passed: it goes
# beside the log, never to docs/conformance.
REPORT_DIR=${CNP_REPORT_DIR:-$REPO/docs/conformance}
[ -n "${CNP_RUN:-}" ] && REPORT_DIR=$REPO/bin
REPORT=$REPORT_DIR/clusternetworkpolicy-$NPAPI_VERSION-standalone-$IP_FAMILY$SUFFIX.yaml
RUNLOG=$REPO/bin/cnp-conformance-$NPAPI_VERSION-standalone-$IP_FAMILY$SUFFIX.log

# Standalone: a cluster kept from a chained run loses its flannel first.
pid_alive flanneld && "$LAB/flannel.sh" down

# The images: agnhost's under the name the suite's pods give, cni-usernet's
# under the one its manifest gives, on both nodes.
for tar in "$AGNHOST_TAR" bin/cni-usernet-image.tar; do
  ctr -n k8s.io images import "$tar" >/dev/null || { rc=1; exit; }
  if [ "$K8S_LAB_NODES" = 2 ]; then
    "$LAB/node2.sh" import "$tar" || { rc=1; exit; }
  fi
done

# The CRD before the agents, so that they watch ClusterNetworkPolicies from
# their start.
log "installing the ClusterNetworkPolicy CRD of network-policy-api $NPAPI_VERSION ($CHANNEL channel)"
kubectl apply -f "$CRD" || { rc=1; exit; }
# kubectl wait fails at once when it reads the CRD before the API server
# gave it any condition; ask again until the minute is up.
crd_deadline=$((SECONDS + 60))
until kubectl wait --for condition=established crd/clusternetworkpolicies.policy.networking.k8s.io --timeout=60s; do
	[ "$SECONDS" -ge "$crd_deadline" ] && { rc=1; exit; }
	sleep 1
done

# The README's standalone install (its e2e-install block), the images
# imported above.
kubectl apply -f manifests/cni-usernet.yaml || { rc=1; exit; }
kubectl -n kube-system rollout status ds/cni-usernet --timeout=5m || { rc=1; exit; }
kubectl wait --for condition=Ready node --all --timeout=3m || { rc=1; exit; }

# A kept cluster's last run may still be deleting the suite's namespaces:
# the suite's first apply would be refused in a terminating one.
kubectl wait --for=delete ns -l conformance-house --timeout=5m >/dev/null 2>&1 || true
log "---- the ClusterNetworkPolicy conformance suite $NPAPI_VERSION, standalone, $IP_FAMILY, $CHANNEL channel, features $FEATURES${CNP_RUN:+, tests matching $CNP_RUN} (log: $RUNLOG)"
mkdir -p "$(dirname "$REPORT")"
s=$(date +%s)
"$SUITE" -test.v -test.count=1 -test.timeout="${CNP_TIMEOUT:-60m}" -test.run "^TestCNPConformance\$${CNP_RUN:+/$CNP_RUN}" \
  -conformance-profiles=ClusterNetworkPolicy -supported-features="$FEATURES" \
  -organization=cni-usernet -project=cni-usernet -url=https://github.com/cni-usernet/cni-usernet \
  -version="$(git describe --always --dirty 2>/dev/null)" -contact=https://github.com/cni-usernet/cni-usernet/issues \
  -additional-info="hack/k8s/cnp-conformance.sh: standalone mode, the $CHANNEL CRD${CNP_RUN:+, tests matching $CNP_RUN}, the hack/k8s lab ($IP_FAMILY, $(kubectl version -o json 2>/dev/null | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | tail -1), two nodes)" \
  -report-output="$REPORT" -debug >"$RUNLOG" 2>&1 || rc=1
log "---- suite: $(( $(date +%s) - s ))s, rc $rc"
# Each test's end, for the terminal (the whole run is in $RUNLOG).
grep -E '^    --- (PASS|FAIL|SKIP)' "$RUNLOG" | sed 's/^    //'
if [ -f "$REPORT" ]; then
  log "report: $REPORT"
  sed -n '/standard:/,$p' "$REPORT"
else
  log "no report written"
  rc=1
fi

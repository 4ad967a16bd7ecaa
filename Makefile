# cni-usernet — see README.md.
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/cni-usernet/cni-usernet/pkg/util/buildinfo.Version=$(VERSION)

.PHONY: build deps demo test test-unit test-root fuzz lint bench bench-quick bench-policy clean gvisor release

# third_party/gvisor: the pinned gVisor with hack/gvisor/patches applied,
# which go.mod's replace points at (docs/gvisor-patches.md). Generated, not
# committed; every target that compiles depends on it.
gvisor:
	hack/gvisor/patch.sh

build: gvisor
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/cni-usernet ./cmd/cni-usernet
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/cni-usernet-stack ./cmd/cni-usernet-stack
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/cni-usernet-agent ./cmd/cni-usernet-agent
	mkdir -p bin/cni
	# a running stack keeps the old file
	for b in cni-usernet-stack cni-usernet; do cp bin/$$b bin/cni/.$$b.new && mv -f bin/cni/.$$b.new bin/cni/$$b || exit 1; done
	CGO_ENABLED=0 $(GO) build -o bin/cni/ github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/main/ptp \
	  github.com/containernetworking/plugins/plugins/meta/portmap github.com/containernetworking/plugins/plugins/meta/bandwidth
	CGO_ENABLED=0 $(GO) build -o bin/ github.com/containernetworking/cni/cnitool

demo:
	hack/demo.sh

# The Debian packages the tests use (hping3, iperf3, nftables …): installed
# when missing, so that `make test` works on a fresh machine on its own.
deps:
	hack/deps.sh

# The whole suite, as CI runs it (root: namespaces, veths, TUN). helm is
# built first: test/docs lints the Helm chart and compares what it renders
# with manifests/cni-usernet.yaml.
test: deps lint helm kubeconform test-root fuzz

# actionlint checks .github/workflows (the release workflow), pinned here
# and fetched from the Go module proxy like the other tools.
ACTIONLINT_VERSION = v1.7.12
lint: gvisor
	@test -z "$$(gofmt -l cmd pkg test hack)" || { gofmt -l cmd pkg test hack; exit 1; }
	$(GO) vet ./...
	$(GO) run ./hack/lint/imports
	$(GO) run github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION) -oneline

# Everything under the race detector (the stack processes the tests start
# are race-built too and halt on a race), with short transfers; then the
# root suites at full size without it, one package at a time: the hostile
# and stress tests load both cores and must not starve each other.
test-root: helm kubeconform gvisor
	HELM=$(CURDIR)/bin/helm KUBECONFORM=$(CURDIR)/bin/kubeconform GORACE=halt_on_error=1 $(GO) test -race -short -count=1 -timeout 20m ./...
	$(GO) test -p 1 -count=1 -timeout 20m ./test/...

# Every fuzz target for a fixed number of inputs (~10 s each here). Counts,
# not durations: go's fuzzer can fail a run with "context deadline
# exceeded" when the -fuzztime deadline catches a worker mid-input.
fuzz: gvisor
	$(GO) test -run '^$$' -fuzz '^FuzzParseEchoRequest$$' -fuzztime 500000x -fuzzminimizetime 2s ./pkg/stack/relay
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 150000x -fuzzminimizetime 2s ./pkg/api/netconf
	$(GO) test -run '^$$' -fuzz '^FuzzGSOAnnotation$$' -fuzztime 150000x -fuzzminimizetime 2s ./pkg/api/netconf
	$(GO) test -run '^$$' -fuzz '^FuzzWireFrames$$' -fuzztime 20000x -fuzzminimizetime 2s ./pkg/stack/podstack
	$(GO) test -run '^$$' -fuzz '^FuzzAdmitIngress$$' -fuzztime 200000x -fuzzminimizetime 2s ./pkg/stack/wirelink
	$(GO) test -run '^$$' -fuzz '^FuzzKubeconfigYAML$$' -fuzztime 50000x -fuzzminimizetime 2s ./pkg/api/kube
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshal$$' -fuzztime 100000x -fuzzminimizetime 2s ./pkg/api/policy
	$(GO) test -run '^$$' -fuzz '^FuzzPcapReader$$' -fuzztime 150000x -fuzzminimizetime 2s ./pkg/cli/capture
	$(GO) test -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime 50000x -fuzzminimizetime 2s ./pkg/agent/netpolicy
	$(GO) test -run '^$$' -fuzz '^FuzzCompilePod$$' -fuzztime 50000x -fuzzminimizetime 2s ./pkg/agent/netpolicy

# Full benchmark (BENCHMARKS.md): 3 interleaved rounds of every
# configuration, the peers (runsc, pasta, slirp4netns) and pod to pod
# across two nodes (xnode-*) included, then the scale section (100 idle
# pods, 1/16/256 streams). The cross-node rows alone:
# hack/bench/run.sh --only xnode.
bench:
	hack/bench/run.sh --peers=true --scale=true

# CI smoke: one short round of our configurations, no peers, no scale.
bench-quick:
	hack/bench/run.sh --quick

# The policy scale benchmark (hack/bench/policyscale, docs/policy.md "At
# scale"): the node agent of this tree and of BASELINE, each as a process
# against a fake API server holding clusters of 10k and 100k pods with 100
# local pods, in one run (~7 min on 2 vCPUs). BASELINE defaults to the revision the
# benchmark was written against (the tree before the policy controller's
# rework); BASELINE= runs this tree alone. BENCH_POLICY_FLAGS passes more
# flags, e.g. --clusters 10k --reps 3.
BASELINE ?= 8eeaa0d0adea7575705009ed9c6047b09809af9b
bench-policy:
	hack/bench/policyscale/run.sh $(if $(BASELINE),--baseline $(BASELINE)) $(BENCH_POLICY_FLAGS)

# promtool, from its own module (hack/promtool): the metrics tests run
# `promtool check metrics` on the agent's scrape when bin/promtool exists
# (promlint, the same linter, always). Not part of `make test`: it compiles
# Prometheus' service discovery SDKs (see docs/metrics.md for the cost).
.PHONY: promtool
promtool:
	cd hack/promtool && $(GO) build -o ../../bin/promtool github.com/prometheus/prometheus/cmd/promtool

# helm, from its own module (hack/helm, pinned there), for the chart's
# checks in test/docs: helm lint --strict and `helm template` against the
# manifest. Rebuilt only when the pin changes (see hack/helm/README.md for
# the cost).
.PHONY: helm
# A release's artifacts in dist/$(VERSION)/: the multi-arch image (OCI
# tarball), binaries, the packaged chart, the manifest it renders, an SBOM
# and checksums (hack/release.sh). VERSION=v1.2.3 is required.
release: helm gvisor
	hack/release.sh $(VERSION)

helm: bin/helm
# The Kubernetes version helm assumes without a cluster (helm template,
# lint: the chart's kubeVersion is checked against it) is its client-go's,
# set as helm's own release build sets it; unset, helm assumes v1.20.
HELM_K8S_MINOR = $(shell sed -n 's|^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*|\1|p' hack/helm/go.mod)
HELM_LDFLAGS = $(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))
bin/helm: hack/helm/go.mod hack/helm/go.sum
	cd hack/helm && $(GO) build -trimpath -ldflags "$(HELM_LDFLAGS)" -o ../../bin/helm helm.sh/helm/v3/cmd/helm

# kubeconform, pinned beside helm (hack/helm): test/docs checks every
# object the chart renders, for each combination of values that changes
# them, against the schemas of the lab's Kubernetes (hack/k8s/toolmod).
.PHONY: kubeconform
kubeconform: bin/kubeconform
bin/kubeconform: hack/helm/go.mod hack/helm/go.sum
	cd hack/helm && $(GO) build -trimpath -o ../../bin/kubeconform github.com/yannh/kubeconform/cmd/kubeconform

clean:
	rm -rf bin results third_party/gvisor

# A real two-node Kubernetes on this machine (hack/k8s, ~11 min the first
# time: it builds Kubernetes), cni-usernet's image, and the end-to-end test
# against that cluster (test/e2e, README "Install on Kubernetes"), in
# standalone mode and then chained behind flannel (hack/k8s/flannel.sh).
.PHONY: image cluster-up cluster-down e2e e2e-churn

image:
	hack/image.sh

cluster-up:
	hack/k8s/up.sh

cluster-down:
	hack/k8s/down.sh --purge

# Cluster up if needed, image, test/e2e, cluster down even on failure.
e2e:
	hack/k8s/e2e.sh

# Pods churned on both nodes through an agent force-deleted, a DaemonSet
# rollout, a containerd restart and a minute without the API server
# (test/e2e TestKubernetesChurn, ~6 min beside the cluster's start); run it
# before merging changes to the plugin, the agent or the installer.
e2e-churn:
	E2E_CHURN=1 E2E_MODES=standalone E2E_RUN=TestKubernetesChurn hack/k8s/e2e.sh

# The lab runs containerd 2 (hack/k8s/containerd2, built once in ~70 s),
# which passes the pod's cgroup to the plugin (cgroupPath); this is the
# standalone suite's check that every stack is charged to its pod from it
# alone (~4 min with the cluster's start and end). e2e-containerd1: the
# same on Debian's containerd 1.6, which passes none (the pod's UID).
.PHONY: e2e-containerd2 e2e-containerd1
e2e-containerd2:
	K8S_LAB_CONTAINERD=2 E2E_MODES=standalone E2E_RUN='TestKubernetes$$|TestKubernetesStackCgroupSource$$' hack/k8s/e2e.sh
e2e-containerd1:
	K8S_LAB_CONTAINERD=1 E2E_MODES=standalone E2E_RUN='TestKubernetes$$|TestKubernetesStackCgroupSource$$|TestKubernetesLabGuard$$' hack/k8s/e2e.sh

# The oldest Kubernetes the lab runs, 1.35 (hack/k8s/toolmod-1.35, built
# once beside the default 1.37), its own cluster: the standalone suite's
# core (install, pods, Services, across the nodes, dual-stack), the
# guard, the stacks' cgroup source.
.PHONY: e2e-k8s-oldest
e2e-k8s-oldest:
	K8S_LAB_KUBERNETES=1.35 E2E_MODES=standalone E2E_RUN='TestKubernetes$$|TestKubernetesStackCgroupSource$$|TestKubernetesLabGuard$$' hack/k8s/e2e.sh

# kube-proxy in nftables mode on both nodes instead of iptables (its own
# `kube-proxy` nft tables), and the whole standalone suite on it: Services,
# NodePort, hostPort, policy, hairpin (hack/k8s/README.md). IPVS cannot
# run on this machine kind's kernel (no ip_vs).
.PHONY: e2e-nftables
e2e-nftables:
	K8S_LAB_PROXY_MODE=nftables E2E_MODES=standalone hack/k8s/e2e.sh

# `make e2e`'s cluster is dual-stack; this is the IPv4-only one (its own
# cluster: a cluster's families are fixed when it is made), the
# standalone suite on it.
.PHONY: e2e-ipv4
e2e-ipv4:
	K8S_LAB_IP_FAMILY=ipv4 E2E_MODES=standalone hack/k8s/e2e.sh

# The upstream ClusterNetworkPolicy conformance suite (network-policy-api's,
# hack/k8s/cnpconformance) on the lab in standalone mode, its report in
# docs/conformance/ (docs/policy.md#upstream-conformance). Not part of
# `make e2e`; K8S_LAB_IP_FAMILY=ipv4 for the IPv4-only cluster.
.PHONY: e2e-cnp-conformance
e2e-cnp-conformance:
	hack/k8s/cnp-conformance.sh

# Nodes on different subnets: a router between the lab's nodes that knows
# no pod CIDR, so the agents carry pods' traffic between the nodes in
# VXLAN (standalone; flannel's own VXLAN when chained), dual-stack.
.PHONY: e2e-routed
e2e-routed:
	K8S_LAB_TOPOLOGY=routed hack/k8s/e2e.sh

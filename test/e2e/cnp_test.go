package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// installCNPCRD installs sig-network's ClusterNetworkPolicy CRD (its
// standard channel, from the network-policy-api module that
// hack/k8s/cnpconformance pins) before the agents start, so that they
// watch ClusterNetworkPolicies from their first list, as on a cluster
// that has the API. remove deletes it again; nil when it was there
// before.
func installCNPCRD(t *testing.T, repo string) (remove func()) {
	const crd = "clusternetworkpolicies.policy.networking.k8s.io"
	if _, err := kubectl("get", "crd", crd); err == nil {
		t.Logf("the ClusterNetworkPolicy CRD is installed already")
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := run(ctx, filepath.Join(repo, "hack", "k8s", "cnpconformance"), "go", "mod", "download", "-json", "sigs.k8s.io/network-policy-api")
	if err != nil {
		t.Fatalf("downloading network-policy-api: %v", err)
	}
	var mod struct{ Version, Dir string }
	if err := json.Unmarshal([]byte(out), &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download -json: %v\n%s", err, out)
	}
	file := filepath.Join(mod.Dir, "config", "crd", "standard", "policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}
	remove = func() {
		if _, err := kubectl("delete", "crd", crd, "--wait=true", "--timeout=60s"); err != nil {
			t.Logf("cleanup: deleting the ClusterNetworkPolicy CRD: %v", err)
		}
	}
	if _, err := kubectl("apply", "-f", file); err != nil {
		remove()
		t.Fatal(err)
	}
	if err := waitEstablished(crd, time.Minute); err != nil {
		remove()
		t.Fatal(err)
	}
	t.Logf("installed the ClusterNetworkPolicy CRD of network-policy-api %s (standard channel)", mod.Version)
	return remove
}

// waitEstablished waits for the CRD's Established condition. kubectl
// wait fails at once, instead of waiting, when it reads the CRD before
// the API server gave it any condition ("accessor error: <nil>"), so that
// answer is asked again until the deadline.
func waitEstablished(crd string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := max(time.Until(deadline).Round(time.Second), time.Second)
		_, err := kubectl("wait", "--for", "condition=established", "crd/"+crd, "--timeout="+left.String())
		if err == nil || !strings.Contains(err.Error(), "accessor error") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cnpModel is what checkClusterNetworkPolicy has applied between its two
// namespaces, the tenant's (cx) and another (cy): allowed derives the
// verdict of each probe from the layers as the API orders them (Admin,
// NetworkPolicy, Baseline, the default).
type cnpModel struct {
	// adminCyToCx is the action of an Admin-tier rule on ingress into
	// cx from cy ("" none): Accept and Deny decide, Pass hands over.
	adminCyToCx string
	// npAllowAllCx, npDenyAllCx: the tenant's NetworkPolicies in cx, an
	// ingress allow of everything, a default deny of ingress.
	npAllowAllCx, npDenyAllCx bool
	// baselineDenyCyToCx: a Baseline-tier Deny of ingress into cx from cy.
	baselineDenyCyToCx bool
	// adminEgressDenyTCP: an Admin-tier Deny of egress from cy to cx on
	// TCP 8080 (the pods' HTTP port, the Services' target port).
	adminEgressDenyTCP bool
}

func (m *cnpModel) allowed(src, dst *mpod, kind string) bool {
	fromCy := src.ns == "cy" && dst.ns == "cx"
	if fromCy && m.adminEgressDenyTCP && strings.HasSuffix(kind, "/tcp") {
		return false
	}
	if dst.ns != "cx" {
		return true
	}
	if fromCy {
		switch m.adminCyToCx {
		case "Accept":
			return true
		case "Deny":
			return false
		}
	}
	switch {
	case m.npDenyAllCx:
		return false
	case m.npAllowAllCx:
		return true
	}
	return !(fromCy && m.baselineDenyCyToCx)
}

// checkClusterNetworkPolicy: a cluster admin's policies against a
// tenant's, in the probe matrix of checkNetworkPolicy. An Admin-tier
// Deny closes what the tenant's NetworkPolicy opens, an Admin Pass hands
// the decision to the NetworkPolicy, a Baseline Deny yields to a
// NetworkPolicy allow and decides where none isolates, an Admin Accept
// opens what the tenant closed, and an Admin egress Deny on one port
// closes that port only, by Service as by pod address.
func checkClusterNetworkPolicy(t *testing.T, prefix string) {
	pods := startMatrixPods(t, prefix, []string{"cx", "cy"}, func(ns, name string) map[string]string { return nil })
	nsOf := func(short string) string { return prefix + "-" + short }
	model := &cnpModel{}
	expect := func(what string) { t.Helper(); expectPolicyMatrix(t, pods, model.allowed, what) }
	admin, baseline, egress := prefix+"-admin", prefix+"-baseline", prefix+"-admin-egress"
	t.Cleanup(func() {
		kubectl("delete", "clusternetworkpolicy", admin, baseline, egress, "--ignore-not-found")
	})
	// A policy of tier on cx's ingress from cy.
	fromCy := func(name, tier, action string) string {
		return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: %s
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}
  ingress:
  - name: from-cy
    action: %s
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}]
`, name, tier, nsOf("cx"), action, nsOf("cy"))
	}
	adminRule := func(action string) string { return fromCy(admin, "Admin", action) }
	npAllowAll := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{}]
`, nsOf("cx"))

	expect("no cluster policy")

	apply(t, npAllowAll)
	apply(t, adminRule("Deny"))
	model.npAllowAllCx, model.adminCyToCx = true, "Deny"
	expect("the tenant allows every ingress into cx, an Admin-tier Deny from cy")
	checkTierDenial(t, pods, nsOf("cx"), "Admin", admin)
	checkImplementedCondition(t, admin)

	apply(t, adminRule("Pass"))
	apply(t, fromCy(baseline, "Baseline", "Deny"))
	model.adminCyToCx, model.baselineDenyCyToCx = "Pass", true
	expect("the Admin rule passes, a Baseline-tier Deny from cy, the tenant allows every ingress")

	mustKubectl(t, "-n", nsOf("cx"), "delete", "networkpolicy", "allow-all")
	model.npAllowAllCx = false
	expect("the Baseline-tier Deny from cy, no NetworkPolicy")
	checkTierDenial(t, pods, nsOf("cx"), "Baseline", baseline)

	apply(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`, nsOf("cx")))
	apply(t, adminRule("Accept"))
	model.npDenyAllCx, model.adminCyToCx = true, "Accept"
	expect("the tenant denies every ingress into cx, an Admin-tier Accept from cy")

	apply(t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}
  egress:
  - name: to-cx-http
    action: Deny
    to: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`, egress, nsOf("cy"), nsOf("cx")))
	model.adminEgressDenyTCP = true
	expect("an Admin-tier egress Deny from cy to cx on TCP 8080")

	mustKubectl(t, "delete", "clusternetworkpolicy", admin, baseline, egress)
	mustKubectl(t, "-n", nsOf("cx"), "delete", "networkpolicy", "deny-all")
	*model = cnpModel{}
	expect("every policy deleted")
}

// checkTierDenial finds, on node 1, a denial of ingress into one of ns's
// pods by the ClusterNetworkPolicy name of tier, as `cni-usernet
// denials` shows it to an operator.
func checkTierDenial(t *testing.T, pods []*mpod, ns, tier, name string) {
	t.Helper()
	findDenial(t, pods, ns, tier+" tier", fmt.Sprintf("ingress denial by the %s tier's %s", tier, name), func(r denialRow) bool {
		return r.Direction == "ingress" && r.Layer == tier && r.Policies == name
	})
}

// checkImplementedCondition: the agents report on the policy's own status
// that cni-usernet implements all of it (the real API server's
// server-side apply to the status subresource, under the agents' RBAC).
func checkImplementedCondition(t *testing.T, name string) {
	t.Helper()
	eventually(t, time.Minute, "the cni-usernet.io/Implemented condition on "+name, func() error {
		out, err := kubectl("get", "clusternetworkpolicy", name, "-o",
			`jsonpath={.status.conditions[?(@.type=="cni-usernet.io/Implemented")].status} {.status.conditions[?(@.type=="cni-usernet.io/Implemented")].reason} {.status.conditions[?(@.type=="cni-usernet.io/Implemented")].observedGeneration} {.metadata.generation}`)
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) != 4 || f[0] != "True" || f[1] != "Implemented" || f[2] != f[3] {
			return fmt.Errorf("status, reason, observed generation, generation: %q", out)
		}
		return nil
	})
}

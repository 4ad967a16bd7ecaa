package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// dualStack says whether the lab's cluster has IPv6 beside IPv4
// (hack/k8s/lib/common.sh's K8S_LAB_IP_FAMILY, passed on by e2e.sh).
func dualStack() bool { return os.Getenv("E2E_IP_FAMILY") == "dual" }

// podIPsOf returns a pod's status.podIPs by family.
func podIPsOf(t *testing.T, ns, name string) (v4, v6 string) {
	t.Helper()
	for _, a := range getPod(t, ns, name).Status.PodIPs {
		if ip, err := netip.ParseAddr(a.IP); err == nil && ip.Is4() {
			v4 = a.IP
		} else if err == nil {
			v6 = a.IP
		}
	}
	return v4, v6
}

// nodeCIDRs returns a node's spec.podCIDRs.
func nodeCIDRs(t *testing.T, name string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, f := range strings.Fields(mustKubectl(t, "get", "node", name, "-o", "jsonpath={.spec.podCIDRs[*]}")) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			t.Fatalf("node %s: pod CIDR %q: %v", name, f, err)
		}
		out = append(out, p)
	}
	return out
}

// checkDualStack: on a dual-stack cluster every pod has an address of each
// family from its node's two pod CIDRs, in status.podIPs and in its stack;
// IPv6 carries pod-to-pod traffic across the nodes (client addresses kept),
// node-to-pod traffic, a PreferDualStack Service's IPv6 ClusterIP and
// NodePort, DNS AAAA answers, hostPort; and NetworkPolicy resolves
// selectors to both addresses and ipBlocks per family.
func checkDualStack(t *testing.T, repo, ns string, chained bool, pods map[string]string) {
	if !dualStack() {
		t.Skip("IPv4-only lab (K8S_LAB_IP_FAMILY=ipv4)")
	}
	if node2() == "" {
		t.Skip("single-node lab (K8S_LAB_NODES=1)")
	}
	v4, v6 := map[string]string{}, map[string]string{}
	nodeOf := map[string]string{"far": node2()}
	names := []string{"far"}
	for name := range pods {
		names = append(names, name)
	}
	for _, name := range names {
		a, b := podIPsOf(t, ns, name)
		if a == "" || b == "" {
			t.Errorf("%s: status.podIPs %+v, want one IPv4 and one IPv6 address", name, getPod(t, ns, name).Status.PodIPs)
			continue
		}
		v4[name], v6[name] = a, b
		node := nodeOf[name]
		if node == "" {
			node = node1()
		}
		in := false
		for _, c := range nodeCIDRs(t, node) {
			in = in || c.Contains(netip.MustParseAddr(b))
		}
		if !in {
			t.Errorf("%s: IPv6 address %s is in none of node %s's pod CIDRs %v", name, b, node, nodeCIDRs(t, node))
		}
	}
	if t.Failed() {
		return
	}
	// The stack holds both addresses (its status, on each node).
	if row, ok := node2Status(t, repo)[ns+"/far"]; !ok || !containsIP(row.IPs, v6["far"]) || !containsIP(row.IPs, v4["far"]) {
		t.Errorf("far's stack on node 2: addresses %v, want %s and %s", row.IPs, v4["far"], v6["far"])
	}
	if row, ok := nodeStatus(t)[ns+"/cli"]; !ok || !containsIP(row.IPs, v6["cli"]) {
		t.Errorf("cli's stack on node 1: addresses %v, want %s", row.IPs, v6["cli"])
	}
	t.Logf("IPv6: %v", v6)

	// The routes between the nodes, IPv6: the agents' (standalone) or
	// flannel's second VXLAN device (chained).
	if !chained {
		want1, want2 := " via "+os.Getenv("E2E_NODE2_IP6")+" ", " via "
		if routedLab() {
			want1, want2 = " dev usernet.vxlan6 ", " dev usernet.vxlan6 "
		}
		out, _ := run(t.Context(), "", "ip", "-6", "route", "show", "proto", "117")
		if !strings.Contains(out, want1) {
			t.Errorf("node 1 has no IPv6 route to node 2's pods%s:\n%s", want1, out)
		}
		if out := onNode2(t, repo, "ip", "-6", "route", "show", "proto", "117"); !strings.Contains(out, want2) {
			t.Errorf("node 2 has no IPv6 route to node 1's pods%s:\n%s", want2, out)
		}
	}

	url := func(ip, port string) string { return "http://" + net.JoinHostPort(ip, port) + "/" }
	// pod <-> pod across the nodes over IPv6, client addresses kept; and
	// node 1 -> the pod on node 2, TCP (full-sized segments) and UDP.
	wantHTTP(t, "cli (node 1) -> far (node 2), IPv6", podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", url(v6["far"], "8080")), "far", v6["cli"])
	wantHTTP(t, "far (node 2) -> srv (node 1), IPv6", podExec(t, ns, "far", "timeout", "15", "wget", "-qO-", url(v6["srv"], "8080")), "srv", v6["far"])
	if err := bulkEcho(net.JoinHostPort(v6["far"], "9000"), 4<<20); err != nil {
		t.Errorf("node 1 -> far TCP echo of 4 MiB over IPv6: %v", err)
	}
	if reply, err := udpEcho(net.JoinHostPort(v6["far"], "9090"), "hello-v6"); err != nil || !strings.HasPrefix(reply, "pod=far ") {
		t.Errorf("node 1 -> far UDP over IPv6: %q, %v", reply, err)
	}

	// A PreferDualStack Service: both ClusterIPs, its IPv6 one through
	// kube-proxy's ip6tables/nft rules, its NodePort on node 2's IPv6
	// address, CoreDNS's AAAA answer.
	apply(t, fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: %s}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {app: far}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
`, ns))
	t.Cleanup(func() { kubectl("-n", ns, "delete", "svc", "dual", "--wait=false") })
	var svc6 string
	for _, ip := range strings.Fields(mustKubectl(t, "-n", ns, "get", "svc", "dual", "-o", "jsonpath={.spec.clusterIPs[*]}")) {
		if strings.Contains(ip, ":") {
			svc6 = ip
		}
	}
	if svc6 == "" {
		t.Fatalf("Service dual: no IPv6 ClusterIP (clusterIPs %s)", mustKubectl(t, "-n", ns, "get", "svc", "dual", "-o", "jsonpath={.spec.clusterIPs}"))
	}
	nodePort := strings.TrimSpace(mustKubectl(t, "-n", ns, "get", "svc", "dual", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	eventually(t, time.Minute, "cli -> Service dual's IPv6 ClusterIP "+svc6, func() error {
		out, err := kubectl("-n", ns, "exec", "cli", "--", "timeout", "10", "wget", "-qO-", url(svc6, "80"))
		if err != nil || !strings.HasPrefix(out, "pod=far ") {
			return fmt.Errorf("answer %q, %v", out, err)
		}
		return nil
	})
	np := url(os.Getenv("E2E_NODE2_IP6"), nodePort)
	eventually(t, time.Minute, "node 1 -> NodePort "+np, func() error {
		body, err := httpGet(np)
		if err != nil || !strings.HasPrefix(body, "pod=far ") {
			return fmt.Errorf("answer %q, %v", body, err)
		}
		return nil
	})
	name := "dual." + ns + ".svc.cluster.local"
	if out := podExec(t, ns, "far", "timeout", "15", "nslookup", "-type=AAAA", name); !strings.Contains(out, svc6) {
		t.Errorf("far: nslookup -type=AAAA %s: want %s in:\n%s", name, svc6, out)
	}

	// hostPort over IPv6 (the portmap plugin's ip6tables rules, with the
	// pod's IPv6 address from the chain's result), from the other node.
	apply(t, hostPortPod(ns, "hp-v6", node2(), fmt.Sprintf("{containerPort: 8080, hostPort: %d, protocol: TCP}", hostHTTPPort)))
	deletePodsAfter(t, ns, "hp-v6")
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/hp-v6", "--timeout=3m")
	hp := url(os.Getenv("E2E_NODE2_IP6"), fmt.Sprint(hostHTTPPort))
	wantHTTP(t, "node 1 -> hostPort "+hp, mustGet(t, hp), "hp-v6", "")

	checkDualStackPolicy(t, ns, v4, v6)
}

// checkDualStackPolicy: an ipBlock admits its own family only, and a pod
// selector admits both addresses of the pods it selects.
func checkDualStackPolicy(t *testing.T, ns string, v4, v6 map[string]string) {
	apply(t, fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: far-v6, namespace: %s}
spec:
  podSelector: {matchLabels: {app: far}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock: {cidr: %s/128}
    ports: [{protocol: TCP, port: 8080}]
  - from:
    - podSelector: {matchLabels: {app: srv}}
    ports: [{protocol: TCP, port: 8080}]
`, ns, v6["cli"]))
	t.Cleanup(func() {
		kubectl("-n", ns, "delete", "networkpolicy", "far-v6", "--wait=false")
		// the checks after this one expect far open again
		eventually(t, time.Minute, "far open again after the policy's removal", func() error {
			return reach(ns, "off", v4["far"])
		})
	})
	want := []struct {
		from, to string
		allowed  bool
	}{
		{"cli", v6["far"], true},  // the ipBlock, IPv6
		{"cli", v4["far"], false}, // the same pod's IPv4 address: no IPv4 block
		{"off", v6["far"], false}, // another pod, IPv6
		{"srv", v4["far"], true},  // the selector: both of srv's addresses
		{"srv", v6["far"], true},
	}
	eventually(t, time.Minute, "the IPv6 policy in force on far", func() error {
		var bad []string
		for _, w := range want {
			if err := reach(ns, w.from, w.to); (err == nil) != w.allowed {
				bad = append(bad, fmt.Sprintf("%s -> %s: allowed %v, want %v (%v)", w.from, w.to, err == nil, w.allowed, err))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}

// reach is one HTTP request from a pod to ip:8080, short enough for a
// denied one to fail fast.
func reach(ns, from, ip string) error {
	// (busybox's wget crashes with -T: timeout(1) bounds it)
	out, err := kubectl("-n", ns, "exec", from, "--", "timeout", "3", "wget", "-qO-", "http://"+net.JoinHostPort(ip, "8080")+"/")
	if err != nil {
		return err
	}
	if !strings.HasPrefix(out, "pod=") {
		return fmt.Errorf("answer %q", out)
	}
	return nil
}

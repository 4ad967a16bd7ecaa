// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestKubernetesLabGuard checks the lab's guard (hack/k8s/up.sh) on the
// nodes' own traffic: a request to a Service's ClusterIP after the
// Service is gone, as upstream's Services specs send from a hostNetwork
// pod, is translated by no kube-proxy and would leave by the machine's
// default route. From node 1 (this process: K8S-LAB-GUARD-OUT in OUTPUT)
// and from node 2's network namespace, which a hostNetwork pod there
// shares (K8S-LAB-GUARD in node 1's FORWARD), it must be refused at once,
// in each of the cluster's families, while the kubernetes Service, which
// kube-proxy translates to the API server, still answers from both.
//
// The guard's rules are checked first, so that without them the test
// fails before it sends anything that could leave the machine.
func TestKubernetesLabGuard(t *testing.T) {
	if os.Getenv("CNI_USERNET_E2E") != "1" || os.Getenv("KUBECONFIG") == "" {
		t.Skip("needs a real cluster: set CNI_USERNET_E2E=1 and KUBECONFIG (`make e2e` brings one up and does)")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	families := []string{"IPv4"}
	if dualStack() {
		families = append(families, "IPv6")
	}

	// The guard, before any request: for each family the hook in OUTPUT
	// and its rule for the Service range, and for every device a default
	// route leaves by, FORWARD's rule for it.
	svcRange := map[string]string{"IPv4": "10.96.0.0/24", "IPv6": "fd10:96::/112"}
	for _, fam := range families {
		ipt, flag := "iptables", "-4"
		if fam == "IPv6" {
			ipt, flag = "ip6tables", "-6"
		}
		checks := [][]string{
			{"OUTPUT", "-j", "K8S-LAB-GUARD-OUT"},
			{"K8S-LAB-GUARD-OUT", "-d", svcRange[fam], "-j", "REJECT"},
			{"FORWARD", "-j", "K8S-LAB-GUARD"},
		}
		for _, dev := range defaultRouteDevs(t, flag) {
			checks = append(checks, []string{"K8S-LAB-GUARD", "-d", svcRange[fam], "-o", dev, "-j", "REJECT"})
		}
		for _, c := range checks {
			if out, err := exec.Command(ipt, append([]string{"-w", "-C"}, c...)...).CombinedOutput(); err != nil {
				t.Fatalf("the lab's guard: no %s rule %q (%v: %s): a request to a stale ClusterIP would leave by the default route",
					ipt, strings.Join(c, " "), err, strings.TrimSpace(string(out)))
			}
		}
	}

	// A stale ClusterIP of each family: a Service's, once the Service is
	// deleted and neither node's kube-proxy has a rule for it any more.
	name := fmt.Sprintf("cu-guard-%d", time.Now().UnixNano()%1e6)
	policy := "SingleStack"
	if dualStack() {
		policy = "RequireDualStack"
	}
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec:
  ipFamilyPolicy: %s
  ports: [{port: 80, protocol: TCP}]
`, name, policy))
	t.Cleanup(func() { kubectl("-n", "default", "delete", "svc", name, "--ignore-not-found") })
	var svc struct {
		Spec struct {
			ClusterIPs []string `json:"clusterIPs"`
		} `json:"spec"`
	}
	if err := kubectlJSON(&svc, "-n", "default", "get", "svc", name); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != len(families) {
		t.Fatalf("Service %s: ClusterIPs %v, want one per family %v", name, svc.Spec.ClusterIPs, families)
	}
	mustKubectl(t, "-n", "default", "delete", "svc", name, "--wait=true")
	const dump = "iptables-save; ip6tables-save; nft list ruleset 2>/dev/null; true"
	eventually(t, 60*time.Second, "no kube-proxy rule left for the deleted Service's ClusterIPs", func() error {
		for _, onTwo := range []bool{false, node2() != ""} {
			var r string
			if onTwo {
				r = onNode2(t, repo, "sh", "-c", dump)
			} else {
				out, _ := exec.Command("sh", "-c", dump).Output()
				r = string(out)
			}
			for _, ip := range svc.Spec.ClusterIPs {
				if regexp.MustCompile(`(^|[^0-9a-f:.])` + regexp.QuoteMeta(ip) + `([^0-9a-f:.]|$)`).MatchString(r) {
					return fmt.Errorf("a rule on node %d still names %s", map[bool]int{false: 1, true: 2}[onTwo], ip)
				}
			}
		}
		return nil
	})

	for _, ip := range svc.Spec.ClusterIPs {
		// Where the kernel would send it without the guard (a route
		// lookup, nothing sent): the machine's default route.
		if out, err := exec.Command("ip", "route", "get", ip).CombinedOutput(); err == nil {
			t.Logf("node 1's route to the stale ClusterIP: %s", strings.TrimSpace(string(out)))
		}
		addr := net.JoinHostPort(ip, "80")
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("node 1: a connection to the stale ClusterIP %s was accepted", addr)
		} else if !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("node 1: connecting to the stale ClusterIP %s after %v: %v, want it refused at once", addr, time.Since(start).Round(time.Millisecond), err)
		}
		if node2() != "" {
			// curl's exit 7 is "failed to connect" (refused or
			// unreachable), 28 its time-out.
			start := time.Now()
			out := node2Curl(t, repo, "http://"+addr+"/")
			if !strings.HasSuffix(out, "exit 7") || time.Since(start) > 4*time.Second {
				t.Errorf("node 2: curl of the stale ClusterIP %s after %v: %s, want the connection refused at once", addr, time.Since(start).Round(time.Millisecond), out)
			}
		}
	}

	// The kubernetes Service (its ClusterIPs: the cluster's primary
	// family only, unless made otherwise), which kube-proxy translates to
	// the API server, still answers from both nodes (any HTTP status: the
	// request carries no credentials).
	var api struct {
		Spec struct {
			ClusterIPs []string `json:"clusterIPs"`
		} `json:"spec"`
	}
	if err := kubectlJSON(&api, "-n", "default", "get", "svc", "kubernetes"); err != nil {
		t.Fatal(err)
	}
	for _, ip := range api.Spec.ClusterIPs {
		u := "https://" + net.JoinHostPort(ip, "443") + "/readyz"
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		out, err := run(ctx, "", "curl", "-sk", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", u)
		cancel()
		if err != nil || out == "000" {
			t.Errorf("node 1: the API server through %s: %q %v", u, out, err)
		}
		if node2() != "" {
			if out := node2Curl(t, repo, u); !strings.Contains(out, "exit 0") {
				t.Errorf("node 2: the API server through %s: %s", u, out)
			}
		}
	}
}

// defaultRouteDevs lists the devices this machine's default routes of a
// family (-4 or -6) leave by.
func defaultRouteDevs(t *testing.T, family string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-j", family, "route", "show", "default").Output()
	if err != nil {
		t.Fatalf("ip %s route show default: %v", family, err)
	}
	var routes []struct {
		Dev string `json:"dev"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		t.Fatalf("ip -j route: %v", err)
	}
	var devs []string
	for _, r := range routes {
		devs = append(devs, r.Dev)
	}
	return devs
}

// node2Curl runs curl in node 2's network namespace, where a hostNetwork
// pod's requests start, and says how it ended: its status line or error,
// and its exit code.
func node2Curl(t *testing.T, repo, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := run(ctx, repo, "hack/k8s/node2.sh", "exec", "sh", "-c",
		`curl -sSk -m 5 -o /dev/null -w '%{http_code}' "$1" 2>&1; echo " exit $?"`, "sh", url)
	if err != nil {
		t.Fatalf("on node 2: %v", err)
	}
	return strings.TrimSpace(out)
}

// Package e2e runs cni-usernet on a real two-node Kubernetes cluster
// (hack/k8s) the way users install it: the README's "Install on Kubernetes"
// commands, then pods, Services, GSO annotations, traffic across the nodes
// (over the routes the agents make), CoreDNS, a DaemonSet restart, pod
// deletion and the README's uninstall while pods still run, checked from
// kubectl and from the nodes. `make e2e` brings the cluster up, runs it
// twice and tears it down: in standalone mode, then (E2E_MODE=chain) with
// cni-usernet chained behind the flannel that hack/k8s/flannel.sh starts,
// where the routes between the nodes are flannel's VXLAN overlay, the
// stacks run with its MTU, and the uninstall must leave flannel's conflist
// byte for byte as it was.
//
// The node is this machine (the cluster's node address lives on lo) and
// every address the test talks to is a pod's or a Service's; the cluster's
// guard rule drops anything a pod sends outside the pod range.
package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
)

// The annotation that chooses a pod's GSO mode, and the reason of the Event
// the plugin posts with its decision.
const (
	gsoAnnotation  = "cni-usernet.io/gso"
	gsoEventReason = "GSOMode"
)

func TestKubernetes(t *testing.T) {
	if os.Getenv("CNI_USERNET_E2E") != "1" || os.Getenv("KUBECONFIG") == "" {
		t.Skip("needs a real cluster: set CNI_USERNET_E2E=1 and KUBECONFIG (`make e2e` brings one up and does)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("CNI_USERNET_E2E=1 needs root: the test inspects the node (processes, links, /var/lib/cni)")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "cu-e2e-" + hex.EncodeToString(suffix)
	manifest := filepath.Join(repo, "manifests", "cni-usernet.yaml")

	// Leave the cluster as we found it also when a step fails: pods first
	// (their DEL needs the plugin installed), then the plugin.
	t.Cleanup(func() {
		if _, err := kubectl("get", "ns", ns); err == nil {
			if _, err := kubectl("delete", "ns", ns, "--wait=true", "--timeout=90s"); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
		if _, err := kubectl("-n", "kube-system", "get", "ds", "cni-usernet"); err == nil {
			// CoreDNS's pods use the plugin too: the agents' uninstall
			// waits for them.
			kubectl("-n", "kube-system", "scale", "deploy/coredns", "--replicas=0")
			if _, err := kubectl("delete", "-f", manifest, "--wait=true", "--timeout=90s"); err != nil {
				t.Logf("cleanup: %v", err)
			}
			waitAgentGone(t)
		}
	})

	// A failed step stops the test; a failed check lets the next ones run
	// (they need only the pods and the installation, which steps set up).
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	check := func(name string, f func(t *testing.T)) { t.Run(name, f) }

	// E2E_MODE=chain (hack/k8s/e2e.sh's second run, on the same cluster):
	// cni-usernet chained behind the flannel (vxlan) that hack/k8s/flannel.sh
	// started on both nodes, installed with the README's chain-mode commands.
	chained := os.Getenv("E2E_MODE") == "chain"
	installBlock := "e2e-install"
	if chained {
		installBlock = "e2e-install-chain"
	}
	// The conf directories of the nodes, and the primary CNI's
	// configuration in each as it was before the install (chain mode).
	confDirs := []string{cniConfDir}
	if node2() != "" {
		confDirs = append(confDirs, node2Dir(cniConfDir))
	}
	primary := map[string][]byte{}

	before := snapshot(t, cniConfDir, cniBinDir)
	var before2 map[string]string
	if node2() != "" {
		before2 = snapshot(t, node2Dir(cniConfDir), node2Dir(cniBinDir))
	}
	var network string

	first := "NodeNotReadyBeforeInstall"
	if chained {
		first = "PrimaryCNIBeforeInstall"
	}
	step(first, func(t *testing.T) {
		if _, err := kubectl("-n", "kube-system", "get", "ds", "cni-usernet"); err == nil {
			t.Fatal("a cni-usernet DaemonSet is already installed (left over from an earlier run?)")
		}
		if chained {
			// Ready on flannel alone; its conflist is the one containerd
			// uses. (The kubelet reports a new conflist within its status
			// period, about 10 s: a node that flannel has just reached may
			// still show the state before it.)
			for _, n := range []string{node1(), node2()} {
				if n == "" {
					continue
				}
				eventually(t, time.Minute, "node "+n+" Ready on the primary CNI", func() error {
					if ok, why := getNode(t, n).ready(); !ok {
						return fmt.Errorf("node %s NotReady on the primary CNI: %s", n, why)
					}
					return nil
				})
			}
			for _, d := range confDirs {
				file, _, types, err := conflistIn(d)
				if err != nil {
					t.Fatal(err)
				}
				if len(types) == 0 || types[0] != "flannel" || slices.Contains(types, "cni-usernet") {
					t.Fatalf("%s: plugins %v, want flannel's own list", file, types)
				}
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				primary[file] = b
				t.Logf("primary CNI: %s, plugins %v", file, types)
			}
			return
		}
		if ok, why := nodeReady(t); ok {
			t.Fatalf("node is Ready before cni-usernet is installed (%s); the cluster must start without a CNI", why)
		} else {
			t.Logf("node NotReady: %s", why)
		}
	})

	// The cluster serves ClusterNetworkPolicy before the agents start.
	step("ClusterNetworkPolicyCRD", func(st *testing.T) {
		if remove := installCNPCRD(st, repo); remove != nil {
			t.Cleanup(remove)
		}
	})
	step("InstallFromREADME", func(t *testing.T) {
		runREADME(t, repo, installBlock, 8*time.Minute)
		eventually(t, 2*time.Minute, "node Ready", func() error {
			if ok, why := nodeReady(t); !ok {
				return fmt.Errorf("node NotReady: %s", why)
			}
			return nil
		})
		if node2() != "" {
			eventually(t, 2*time.Minute, "node 2 Ready", func() error {
				if ok, why := getNode(t, node2()).ready(); !ok {
					return fmt.Errorf("node 2 NotReady: %s", why)
				}
				return nil
			})
		}
		file, name, typ, err := installedConflist()
		if err != nil {
			t.Fatal(err)
		}
		if chained {
			// Appended to flannel's list under its own name, on both nodes,
			// with bandwidth, which flannel's list lacks, just before it
			// (the bandwidth plugin looks for the pod's veth, which
			// cni-usernet moves; flannel's own portmap stays the only one).
			want := []string{"flannel", "portmap", "bandwidth", "cni-usernet"}
			for _, d := range confDirs {
				f, _, types, err := conflistIn(d)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := primary[f]; !ok || !slices.Equal(types, want) {
					t.Fatalf("containerd uses %s, plugins %v: want flannel's list, plugins %v", f, types, want)
				}
				t.Logf("%s: plugins %v", f, types)
			}
		} else if typ != "cni-usernet" {
			t.Fatalf("containerd uses %s, whose first plugin is %q, not cni-usernet", file, typ)
		} else if _, _, types, err := conflistIn(cniConfDir); err != nil || !slices.Equal(types, []string{"cni-usernet", "portmap"}) {
			t.Fatalf("%s: plugins %v (%v), want cni-usernet (which shapes pods itself), portmap", file, types, err)
		}
		network = name
		t.Logf("node Ready; containerd uses %s (network %q)", file, network)
		for _, f := range []string{installed, installedStack} {
			if _, err := os.Stat(f); err != nil {
				t.Fatal(err)
			}
		}
		// Least privilege: what the agent and the plugin use, nothing more.
		sa := "--as=system:serviceaccount:kube-system:cni-usernet"
		for _, c := range []struct {
			verb, resource string
			ns             string
			want           string
		}{
			{"get", "pods", "default", "yes"},
			{"create", "events", "default", "yes"},
			{"get", "nodes", "", "yes"},
			{"list", "nodes", "", "yes"},
			{"watch", "nodes", "", "no"},
			{"get", "daemonsets.apps/cni-usernet", "kube-system", "yes"},
			{"list", "pods", "default", "yes"},
			{"watch", "pods", "default", "yes"},
			{"watch", "networkpolicies.networking.k8s.io", "default", "yes"},
			{"list", "namespaces", "", "yes"},
			{"watch", "services", "default", "yes"},
			{"watch", "endpointslices.discovery.k8s.io", "default", "yes"},
			{"create", "networkpolicies.networking.k8s.io", "default", "no"},
			{"update", "pods", "default", "no"},
			{"get", "secrets", "kube-system", "no"},
			{"get", "daemonsets.apps/other", "kube-system", "no"},
			{"update", "nodes", "", "no"},
		} {
			args := []string{"auth", "can-i", c.verb, c.resource, sa}
			if c.ns != "" {
				args = append(args, "-n", c.ns)
			}
			out, _ := kubectl(args...) // exit status 1 means "no"
			if got := strings.TrimSpace(out); got != c.want {
				t.Errorf("service account may %s %s in %q: %q, want %q", c.verb, c.resource, c.ns, got, c.want)
			}
		}
	})

	step("PodImage", func(t *testing.T) { buildPodImage(t, repo) })

	// One pod per GSO mode, and one without the annotation; all serve.
	pods := map[string]string{"srv": "hardware", "cli": "software", "off": "off", "plain": ""}
	podIP := map[string]string{}
	var svcIP string
	step("PodsAndService", func(t *testing.T) {
		var m strings.Builder
		fmt.Fprintf(&m, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)
		for name, mode := range pods {
			m.WriteString(podManifest(ns, name, mode))
		}
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: srv, namespace: %s}
spec:
  selector: {app: srv}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
  - {name: dns, protocol: UDP, port: 53, targetPort: 53}
`, ns)
		apply(t, m.String())
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m")
		for name := range pods {
			p := getPod(t, ns, name)
			podIP[name] = p.Status.PodIP
		}
		svcIP = serviceReady(t, ns, "srv", podIP["srv"])
		t.Logf("pods %v, Service srv %s", podIP, svcIP)
	})

	check("UserspaceStacks", func(t *testing.T) {
		st := nodeStatus(t)
		for name := range pods {
			row, ok := st[ns+"/"+name]
			if !ok {
				t.Errorf("%s: not in cni-usernet status", name)
				continue
			}
			if !row.Healthy {
				t.Errorf("%s: unhealthy: %s", name, row.Problem)
			}
			if !stackAlive(row.PID) {
				t.Errorf("%s: stack process %d is not running", name, row.PID)
			} else if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", row.PID)); err != nil || exe != installedStack {
				t.Errorf("%s: stack process %d runs %s (%v), want %s", name, row.PID, exe, err, installedStack)
			}
			if !containsIP(row.IPs, podIP[name]) {
				t.Errorf("%s: status IPs %v, pod IP %s", name, row.IPs, podIP[name])
			}
			// The pod's own view: lo and eth0, the stack's TUN with the
			// pod IP; the link to the node is in the stack's namespace.
			if links := strings.Fields(mustKubectl(t, "-n", ns, "exec", name, "--", "ls", "/sys/class/net")); !slices.Equal(links, []string{"eth0", "lo"}) {
				t.Errorf("%s: the pod's links: got %v, want [eth0 lo]", name, links)
			}
			// Only a TUN has tun_flags.
			if _, err := kubectl("-n", ns, "exec", name, "--", "cat", "/sys/class/net/eth0/tun_flags"); err != nil {
				t.Errorf("%s: eth0 is not the stack's TUN: %v", name, err)
			}
			eth0 := mustKubectl(t, "-n", ns, "exec", name, "--", "ip", "-o", "addr", "show", "dev", "eth0")
			if !strings.Contains(eth0, " "+podIP[name]+"/") {
				t.Errorf("%s: eth0 lacks the pod IP %s:\n%s", name, podIP[name], eth0)
			}
			checkMTU(t, ns, name, row, chained, false)
		}
		if err := readNodeState(t, network).consistent(); err != nil {
			t.Error(err)
		}
	})

	check("GSOModeByAnnotation", func(t *testing.T) {
		st := nodeStatus(t)
		for name, want := range pods {
			row := st[ns+"/"+name]
			got := row.GSO.Mode
			if want == "" {
				// No annotation: the default, auto, picks one of these.
				if got != "hardware" && got != "software" {
					t.Errorf("%s (no annotation): status gso.mode %q", name, got)
				}
			} else if got != want {
				t.Errorf("%s (annotated %s): status gso.mode %q (%s)", name, want, got, row.GSO.Reason)
			}
			mode := got
			eventually(t, 30*time.Second, name+": GSO Event", func() error {
				evs, err := podEvents(ns, name)
				if err != nil {
					return err
				}
				for _, e := range evs {
					if e.Reason == gsoEventReason && strings.HasPrefix(e.Message, "GSO "+mode+" ") {
						t.Logf("%s: event %s %s: %s", name, e.Type, e.Reason, e.Message)
						return nil
					}
				}
				return fmt.Errorf("no %s event saying \"GSO %s\":%s", gsoEventReason, mode, formatEvents(evs))
			})
		}
	})

	check("Traffic", func(t *testing.T) {
		srv := podIP["srv"]
		// pod -> pod, from each mode, with the client's address preserved.
		for _, c := range []string{"cli", "off", "plain"} {
			out := podExec(t, ns, c, "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(srv, "8080")+"/")
			wantHTTP(t, c+" -> srv pod", out, "srv", podIP[c])
		}
		out := podExec(t, ns, "srv", "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(podIP["off"], "8080")+"/")
		wantHTTP(t, "srv -> off pod", out, "off", srv)
		// pod -> Service ClusterIP, through kube-proxy's DNAT.
		out = podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", "http://"+svcIP+"/")
		wantHTTP(t, "cli -> Service", out, "srv", "")
		// hairpin: the Service's only backend reaching itself through it.
		out = podExec(t, ns, "srv", "timeout", "15", "wget", "-qO-", "http://"+svcIP+"/")
		wantHTTP(t, "srv -> own Service (hairpin)", out, "srv", "")
		// DNS-shaped UDP from a pod to a Service.
		out = podExec(t, ns, "off", "timeout", "15", "nslookup", "e2e.test.", svcIP)
		if !strings.Contains(out, "198.51.100.53") {
			t.Errorf("off -> Service DNS: no answer in:\n%s", out)
		}
		// node -> every pod, HTTP and UDP.
		for name := range pods {
			body, err := httpGet("http://" + net.JoinHostPort(podIP[name], "8080") + "/")
			if err != nil {
				t.Errorf("node -> %s HTTP: %v", name, err)
			} else {
				wantHTTP(t, "node -> "+name+" HTTP", body, name, "")
			}
			if reply, err := udpEcho(net.JoinHostPort(podIP[name], "9090"), "hello-"+name); err != nil {
				t.Errorf("node -> %s UDP: %v", name, err)
			} else if !strings.Contains(reply, "pod="+name+" ") || !strings.HasSuffix(reply, "data=hello-"+name) {
				t.Errorf("node -> %s UDP: reply %q", name, reply)
			}
		}
	})

	check("Metrics", func(t *testing.T) { checkPodMetrics(t, ns, pods) })
	check("CaptureBothLegs", func(t *testing.T) { checkCapture(t, ns, "srv", podIP["srv"]) })

	// Two nodes (hack/k8s/node2.sh): pods on node 2 reach and are reached
	// from node 1 through both pods' stacks, over the routes the agents
	// made between the nodes (standalone mode: host-gw on the lab's link).
	farIP := map[string]string{}
	check("AcrossNodes", func(t *testing.T) {
		if node2() == "" {
			t.Skip("single-node lab (K8S_LAB_NODES=1)")
		}
		web := map[string]string{"role": "web"}
		var m strings.Builder
		m.WriteString(podManifestOn(ns, "near", "", node1(), web))
		m.WriteString(podManifestOn(ns, "far", "", node2(), web))
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: %s}
spec:
  type: NodePort
  selector: {role: web}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
  - {name: udp, protocol: UDP, port: 9090, targetPort: 9090}
---
apiVersion: v1
kind: Service
metadata: {name: far, namespace: %s}
spec:
  selector: {app: far}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
`, ns, ns)
		apply(t, m.String())
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/near", "pod/far", "--timeout=3m")
		pods["near"] = ""
		podIP["near"] = getPod(t, ns, "near").Status.PodIP
		farIP["far"] = getPod(t, ns, "far").Status.PodIP
		webIP := strings.TrimSpace(mustKubectl(t, "-n", ns, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"))
		farSvc := strings.TrimSpace(mustKubectl(t, "-n", ns, "get", "svc", "far", "-o", "jsonpath={.spec.clusterIP}"))
		nodePort := strings.TrimSpace(mustKubectl(t, "-n", ns, "get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"))
		t.Logf("near %s (node 1), far %s (node 2), Service web %s NodePort %s, Service far %s",
			podIP["near"], farIP["far"], webIP, nodePort, farSvc)

		// The routes between the nodes: the agents' (standalone) or
		// flannel's over its VXLAN device (chained: the agents make none).
		if chained {
			for _, two := range []bool{false, true} {
				if r := strings.TrimSpace(agentRoutes(t, repo, two)); r != "" {
					t.Errorf("chain mode, yet the agent made routes to other nodes (node 2: %v):\n%s", two, r)
				}
			}
			out, _ := run(t.Context(), "", "ip", "route", "show", "dev", "flannel.1")
			if !strings.Contains(out, "onlink") {
				t.Errorf("node 1 has no route over flannel.1:\n%s", out)
			} else {
				t.Logf("node 1 routes over flannel.1: %s", strings.TrimSpace(out))
			}
		} else {
			// On one link the other node is the next hop; behind a
			// router (K8S_LAB_TOPOLOGY=routed) the agents encapsulate.
			want1, want2 := " via "+node2IP()+" ", " via "
			if routedLab() {
				want1, want2 = " dev usernet.vxlan ", " dev usernet.vxlan "
			}
			if r := agentRoutes(t, repo, false); !strings.Contains(r, want1) {
				t.Errorf("node 1 has no route to node 2's pods%s:\n%s", want1, r)
			} else {
				t.Logf("node 1 routes (proto 117): %s", strings.TrimSpace(r))
			}
			if r := agentRoutes(t, repo, true); !strings.Contains(r, want2) {
				t.Errorf("node 2 has no route to node 1's pods%s:\n%s", want2, r)
			} else {
				t.Logf("node 2 routes (proto 117): %s", strings.TrimSpace(r))
			}
		}
		row, ok := node2Status(t, repo)[ns+"/far"]
		if !ok || !row.Healthy || !containsIP(row.IPs, farIP["far"]) {
			t.Errorf("far on node 2: status %+v", row)
		}
		checkMTU(t, ns, "far", row, chained, true)
		// (an earlier run's uninstall scaled it to 0 where the cluster was kept)
		mustKubectl(t, "-n", "kube-system", "scale", "deploy/coredns", "--replicas=1")
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "deploy/coredns", "--timeout=3m")

		traffic := func(t *testing.T, far string) {
			// Full-sized segments both ways through far's stack, across
			// the nodes (over the VXLAN overlay when chained: a stack
			// sending segments for a larger MTU than the overlay's would
			// stall here).
			if err := bulkEcho(net.JoinHostPort(far, "9000"), 4<<20); err != nil {
				t.Errorf("node 1 -> far TCP echo of 4 MiB: %v", err)
			}
			// pod <-> pod across nodes, client address preserved both ways.
			out := podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(far, "8080")+"/")
			wantHTTP(t, "cli (node 1) -> far (node 2)", out, "far", podIP["cli"])
			out = podExec(t, ns, "far", "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(podIP["srv"], "8080")+"/")
			wantHTTP(t, "far (node 2) -> srv (node 1)", out, "srv", far)
			// UDP across nodes: a DNS query to far's own server, and echo from node 1.
			out = podExec(t, ns, "cli", "timeout", "15", "nslookup", "e2e.test.", far)
			if !strings.Contains(out, "198.51.100.53") {
				t.Errorf("cli -> far DNS over UDP: no answer in:\n%s", out)
			}
			if reply, err := udpEcho(net.JoinHostPort(far, "9090"), "hello-far"); err != nil {
				t.Errorf("node 1 -> far UDP: %v", err)
			} else if !strings.HasPrefix(reply, "pod=far ") {
				t.Errorf("node 1 -> far UDP: reply %q", reply)
			}
			if body, err := httpGet("http://" + net.JoinHostPort(far, "8080") + "/"); err != nil {
				t.Errorf("node 1 -> far HTTP: %v", err)
			} else {
				wantHTTP(t, "node 1 -> far", body, "far", "")
			}
			// ClusterIP with a backend on each node: both answer.
			seen := map[string]bool{}
			for i := 0; i < 40 && len(seen) < 2; i++ {
				out := podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", "http://"+webIP+"/")
				if f := strings.Fields(out); len(f) > 0 {
					seen[strings.TrimPrefix(f[0], "pod=")] = true
				}
			}
			if !seen["near"] || !seen["far"] {
				t.Errorf("cli -> Service web: answered by %v, want near and far", seen)
			}
			// NodePort on node 2, from node 1 and from a pod on node 1.
			np := "http://" + net.JoinHostPort(node2IP(), nodePort) + "/"
			if body, err := httpGet(np); err != nil || (!strings.HasPrefix(body, "pod=near ") && !strings.HasPrefix(body, "pod=far ")) {
				t.Errorf("node 1 -> NodePort %s on node 2: %q, %v", np, body, err)
			}
			out = podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", np)
			if !strings.HasPrefix(out, "pod=near ") && !strings.HasPrefix(out, "pod=far ") {
				t.Errorf("cli -> NodePort %s on node 2: %q", np, out)
			}
			// A Service by its DNS name (CoreDNS), from both nodes.
			name := "web." + ns + ".svc.cluster.local"
			for _, c := range []string{"cli", "far"} {
				out = podExec(t, ns, c, "timeout", "15", "nslookup", name)
				if !strings.Contains(out, webIP) {
					t.Errorf("%s: nslookup %s: want %s in:\n%s", c, name, webIP, out)
				}
				out = podExec(t, ns, c, "timeout", "15", "wget", "-qO-", "http://"+name+"/")
				if !strings.HasPrefix(out, "pod=near ") && !strings.HasPrefix(out, "pod=far ") {
					t.Errorf("%s -> http://%s/: %q", c, name, out)
				}
			}
			// Hairpin on node 2: far through its own Service (whose
			// endpoint kube-proxy may still be updating after a restart).
			eventually(t, 30*time.Second, "far -> own Service (hairpin, node 2)", func() error {
				out, err := kubectl("-n", ns, "exec", "far", "--", "timeout", "10", "wget", "-qO-", "http://"+farSvc+"/")
				if err != nil || !strings.HasPrefix(out, "pod=far ") {
					return fmt.Errorf("answer %q, %v", out, err)
				}
				return nil
			})
		}
		t.Run("Traffic", func(t *testing.T) { traffic(t, farIP["far"]) })

		// far restarted (deleted and created again) on node 2: a new
		// attachment, a new address, and everything works as before.
		t.Run("RestartedOnNode2", func(t *testing.T) {
			mustKubectl(t, "-n", ns, "delete", "pod", "far", "--wait=true", "--timeout=2m")
			apply(t, podManifestOn(ns, "far", "", node2(), web))
			mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/far", "--timeout=2m")
			farIP["far"] = getPod(t, ns, "far").Status.PodIP
			eventually(t, time.Minute, "Service web's endpoints follow far", func() error {
				out, err := kubectl("-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=web",
					"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
				if err != nil {
					return err
				}
				if !strings.Contains(" "+out+" ", " "+farIP["far"]+" ") {
					return fmt.Errorf("endpoints %q lack far's new address %s", out, farIP["far"])
				}
				return nil
			})
			t.Logf("far restarted on node 2 with %s", farIP["far"])
			traffic(t, farIP["far"])
		})
	})

	// hostPort and the bandwidth annotations: portmap chained after
	// cni-usernet, bandwidth shaped by cni-usernet itself (standalone) or
	// by the bandwidth plugin before it (chained; flannel's list lacks it).
	check("SocketRedirectDirect", func(t *testing.T) { checkSocketRedirectDirect(t, ns, chained) })
	check("DualStack", func(t *testing.T) { checkDualStack(t, repo, ns, chained, pods) })
	check("HostPort", func(t *testing.T) { checkHostPort(t, repo, ns) })
	check("Bandwidth", func(t *testing.T) { checkBandwidth(t, ns, network) })
	check("NetworkPolicy", func(t *testing.T) { checkNetworkPolicy(t, repo, ns) })
	check("ClusterNetworkPolicy", func(t *testing.T) { checkClusterNetworkPolicy(t, ns) })
	check("TerminatingPeer", func(t *testing.T) { checkTerminatingPeer(t, ns) })
	check("NetworkPolicyPropagation", func(t *testing.T) { checkPolicyPropagation(t, ns, policyPods()) })

	check("BadAnnotation", func(t *testing.T) {
		apply(t, podManifest(ns, "bad", "turbo"))
		eventually(t, 2*time.Minute, "bad annotation's error in the pod's events", func() error {
			evs, err := podEvents(ns, "bad")
			if err != nil {
				return err
			}
			for _, e := range evs {
				// The reason docs/troubleshooting.md tells an operator to
				// look for ("A pod stuck in ContainerCreating").
				if e.Type == "Warning" && e.Reason == "InvalidGSOAnnotation" && strings.Contains(e.Message, gsoAnnotation) && strings.Contains(e.Message, "turbo") {
					t.Logf("bad: event %s %s: %s", e.Type, e.Reason, e.Message)
					return nil
				}
			}
			return fmt.Errorf("no Warning InvalidGSOAnnotation naming %s and turbo:%s", gsoAnnotation, formatEvents(evs))
		})
		if p := getPod(t, ns, "bad"); p.Status.Phase != "Pending" || p.Status.PodIP != "" {
			t.Errorf("bad: phase %s, IP %q; want Pending without an IP", p.Status.Phase, p.Status.PodIP)
		}
		// Nothing of the failed ADDs stays: no attachment for the pod, and
		// every stack, veth and lease on the node belongs to a good pod.
		s := readNodeState(t, network)
		if a := s.attachmentOf(ns, "bad"); a != nil {
			t.Errorf("bad: attachment state left: %+v", a)
		}
		if err := s.consistent(); err != nil {
			t.Error(err)
		}
		if n := s.inNamespace(ns); n != len(pods) {
			t.Errorf("%d attachments of the test's pods on the node, want %d (one per running pod)", n, len(pods))
		}
		mustKubectl(t, "-n", ns, "delete", "pod", "bad", "--wait=true")
	})

	check("RolloutRestartKeepsConnections", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(podIP["srv"], "9000"), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		echo(t, conn, r, "before the restart")
		// A stack the agent restarted is the agent's child: it must outlive
		// the agent's container too (the agent moves it out of its cgroup).
		killed := nodeStatus(t)[ns+"/cli"].PID
		if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
			t.Fatalf("killing cli's stack %d: %v", killed, err)
		}
		eventually(t, time.Minute, "agent restarts cli's killed stack", func() error {
			row := nodeStatus(t)[ns+"/cli"]
			if row.PID == killed || !row.Healthy || !stackAlive(row.PID) {
				return fmt.Errorf("cli: stack pid %d, healthy %v: %s", row.PID, row.Healthy, row.Problem)
			}
			return nil
		})
		eventually(t, 30*time.Second, "node -> cli after its stack's restart", func() error {
			body, err := httpGet("http://" + net.JoinHostPort(podIP["cli"], "8080") + "/")
			if err == nil && !strings.HasPrefix(body, "pod=cli ") {
				err = fmt.Errorf("answer %q", body)
			}
			return err
		})
		stacksBefore := map[string]int{}
		for name := range pods {
			stacksBefore[name] = nodeStatus(t)[ns+"/"+name].PID
		}
		agentBefore := agentPods(t)
		mustKubectl(t, "-n", "kube-system", "rollout", "restart", "ds/cni-usernet")
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=3m")
		eventually(t, time.Minute, "old agent pod gone", func() error {
			now := agentPods(t)
			for _, p := range now {
				for _, o := range agentBefore {
					if p == o {
						return fmt.Errorf("agent pods %v, before %v", now, agentBefore)
					}
				}
			}
			return nil
		})
		echo(t, conn, r, "after the restart")
		st := nodeStatus(t)
		for name, pid := range stacksBefore {
			if st[ns+"/"+name].PID != pid {
				t.Errorf("%s: stack PID %d before the restart, %d after", name, pid, st[ns+"/"+name].PID)
			}
		}
		body, err := httpGet("http://" + net.JoinHostPort(podIP["cli"], "8080") + "/")
		if err != nil {
			t.Errorf("node -> cli (stack restarted by the old agent) after the rollout: %v", err)
		} else {
			wantHTTP(t, "node -> cli after the rollout", body, "cli", "")
		}
		// The new agent serves new pods too.
		apply(t, podManifest(ns, "late", "software"))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/late", "--timeout=2m")
		pods["late"] = "software"
		podIP["late"] = getPod(t, ns, "late").Status.PodIP
		body, err = httpGet("http://" + net.JoinHostPort(podIP["late"], "8080") + "/")
		if err != nil {
			t.Fatal(err)
		}
		wantHTTP(t, "node -> late", body, "late", "")
	})

	// Every stack is charged to its pod, the one the old agent restarted
	// after its kill -9 and those the rollout left included; under load, a
	// pod limited to 100m pays for its stack's CPU within that limit.
	check("StacksInPodCgroups", func(t *testing.T) {
		var names []string
		for name := range pods {
			names = append(names, name)
		}
		checkStacksInPodCgroups(t, ns, names)
	})
	check("StackChargedToPod", func(t *testing.T) { checkStackCharged(t, ns) })

	// Pods that stay for the uninstall below: the sequence is
	// "uninstall with two pods on cni-usernet, then delete the pods".
	keep := map[string]bool{"srv": true, "cli": true}

	// leftovers of pods that are deleted: stack, veth, state file, leases.
	type left struct {
		name, veth, file string
		pid              int
		ips              []string
	}
	leftOf := func(t *testing.T, s nodeState, names []string) []left {
		t.Helper()
		var out []left
		for _, name := range names {
			a := s.attachmentOf(ns, name)
			if a == nil {
				t.Fatalf("%s: no attachment state", name)
			}
			var ips []string
			for _, ip := range a.IPs {
				ips = append(ips, strings.SplitN(ip, "/", 2)[0])
			}
			out = append(out, left{name, a.HostVeth, filepath.Join(stateDir, stateKeyFile(a.ContainerID, a.IfName)), a.StackPID, ips})
		}
		return out
	}
	gone := func(l left) error {
		if stackAlive(l.pid) {
			return fmt.Errorf("%s: stack %d still runs", l.name, l.pid)
		}
		if _, err := net.InterfaceByName(l.veth); err == nil {
			return fmt.Errorf("%s: veth %s still exists", l.name, l.veth)
		}
		if _, err := os.Stat(l.file); err == nil {
			return fmt.Errorf("%s: state %s still exists", l.name, l.file)
		}
		for _, ip := range l.ips {
			if _, err := os.Stat(filepath.Join(leaseRoot, network, ip)); err == nil {
				return fmt.Errorf("%s: lease of %s still held", l.name, ip)
			}
		}
		return nil
	}

	check("DeletingPodsRemovesEverything", func(t *testing.T) {
		var del []string
		for name := range pods {
			if !keep[name] {
				del = append(del, name)
			}
		}
		mine := leftOf(t, readNodeState(t, network), del)
		mustKubectl(t, append([]string{"-n", ns, "delete", "pod", "--wait=true", "--timeout=2m"}, del...)...)
		eventually(t, time.Minute, "stacks, veths, state and leases of the deleted pods gone", func() error {
			for _, l := range mine {
				if err := gone(l); err != nil {
					return err
				}
			}
			s := readNodeState(t, network)
			if n := s.inNamespace(ns); n != len(keep) {
				return fmt.Errorf("%d attachments of the test's pods left, want %d (the pods kept)", n, len(keep))
			}
			return s.consistent()
		})
	})

	check("MetricsOfDeletedPodsGone", func(t *testing.T) { checkDeletedPodMetrics(t, ns, pods, keep) })

	// An uninstall reverted: deleted while pods run, applied
	// again before they are gone.
	check("ReinstallDuringDeferredUninstall", func(t *testing.T) {
		probe := map[string]string{"srv": podIP["srv"], "cli": podIP["cli"]}
		if farIP["far"] != "" {
			probe["far"] = farIP["far"]
		}
		checkReinstallDuringDeferredUninstall(t, manifest, chained, ns, probe)
	})

	// Uninstall while pods still run, as an admin would: the README's
	// `kubectl delete -f`, then the pods. The agent keeps the plugin and
	// its configuration until the last pod is gone (their DEL needs
	// them), then restores the node.
	check("UninstallWhilePodsRun", func(t *testing.T) {
		names := []string{"srv", "cli"}
		mine := leftOf(t, readNodeState(t, network), names)
		agents := agentPods(t)
		runREADME(t, repo, "e2e-uninstall", 3*time.Minute)
		eventually(t, time.Minute, "the agent says it defers the uninstall", func() error {
			for _, a := range agents {
				out, err := kubectl("-n", "kube-system", "logs", a, "--tail=50")
				if err != nil {
					return err
				}
				if strings.Contains(out, "uninstall deferred") && strings.Contains(out, ns+"/srv") && strings.Contains(out, ns+"/cli") {
					if node2() != "" && farIP["far"] != "" {
						// node 2's agent waits for far
						found := false
						for _, b := range agents {
							o, _ := kubectl("-n", "kube-system", "logs", b, "--tail=50")
							found = found || (strings.Contains(o, "uninstall deferred") && strings.Contains(o, ns+"/far"))
						}
						if !found {
							return fmt.Errorf("no agent log line saying the uninstall is deferred for %s/far (node 2)", ns)
						}
					}
					for _, l := range strings.Split(out, "\n") {
						if strings.Contains(l, "uninstall deferred") {
							t.Logf("agent %s: %s", a, l)
						}
					}
					return nil
				}
			}
			return fmt.Errorf("no agent log line saying the uninstall is deferred for %s/srv and %s/cli", ns, ns)
		})
		// Meanwhile the pods keep their network, and what their DEL needs
		// stays.
		for _, f := range []string{installed, installedStack} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("plugin binary gone while pods use it: %v", err)
			}
		}
		if _, _, types, err := conflistIn(cniConfDir); err != nil || !slices.Contains(types, "cni-usernet") {
			t.Errorf("configuration gone while pods use it: plugins %v, %v", types, err)
		}
		for _, name := range names {
			if body, err := httpGet("http://" + net.JoinHostPort(podIP[name], "8080") + "/"); err != nil {
				t.Errorf("node -> %s during the deferred uninstall: %v", name, err)
			} else {
				wantHTTP(t, "node -> "+name+" during the deferred uninstall", body, name, "")
			}
		}
		// Now the pods: their deletion must complete (no Terminating
		// forever), and leave nothing behind.
		start := time.Now()
		mustKubectl(t, "delete", "ns", ns, "--wait=true", "--timeout=2m")
		// CoreDNS (kube-system) runs on cni-usernet too: its pods go as well.
		mustKubectl(t, "-n", "kube-system", "scale", "deploy/coredns", "--replicas=0")
		eventually(t, 2*time.Minute, "CoreDNS pods gone", func() error {
			out, err := kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "name")
			if err != nil || strings.TrimSpace(out) != "" {
				return fmt.Errorf("%q, %v", out, err)
			}
			return nil
		})
		t.Logf("namespace with the pods deleted in %s", time.Since(start).Round(time.Second))
		eventually(t, time.Minute, "stacks, veths, state and leases of the deleted pods gone", func() error {
			for _, l := range mine {
				if err := gone(l); err != nil {
					return err
				}
			}
			return nil
		})
		waitAgentGone(t)
		var diff []string
		eventually(t, time.Minute, "/etc/cni/net.d and /opt/cni/bin as before the install", func() error {
			diff = diffSnapshots(before, snapshot(t, cniConfDir, cniBinDir))
			if diff != nil {
				return fmt.Errorf("\n  %s", strings.Join(diff, "\n  "))
			}
			return nil
		})
		if chained {
			// flannel's conflist byte for byte as it was, on both nodes;
			// the nodes stay Ready on it.
			for f, b := range primary {
				now, err := os.ReadFile(f)
				if err != nil {
					t.Errorf("primary CNI's configuration after the uninstall: %v", err)
				} else if !bytes.Equal(now, b) {
					t.Errorf("%s after the uninstall:\n%s\nbefore the install:\n%s", f, now, b)
				}
			}
			if ok, why := nodeReady(t); !ok {
				t.Errorf("node NotReady on flannel after the uninstall: %s", why)
			}
		} else {
			waitNodesNotReady(t)
		}
		if node2() != "" {
			if d := diffSnapshots(before2, snapshot(t, node2Dir(cniConfDir), node2Dir(cniBinDir))); d != nil {
				t.Errorf("node 2's CNI directories not as before the install:\n  %s", strings.Join(d, "\n  "))
			}
			for _, two := range []bool{false, true} {
				if r := strings.TrimSpace(agentRoutes(t, repo, two)); r != "" {
					t.Errorf("routes to other nodes left after the uninstall (node 2: %v):\n%s", two, r)
				}
			}
		}
	})
}

// podManifest is a test pod running podtool, with the GSO annotation when
// mode is not empty.
// serviceReady is Service name's cluster IP once its endpoints are
// backend alone: kube-proxy programs a Service once they are ready.
func serviceReady(t *testing.T, ns, name, backend string) string {
	t.Helper()
	eventually(t, time.Minute, "Service "+name+"'s endpoints", func() error {
		out, err := kubectl("-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name="+name,
			"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != backend {
			return fmt.Errorf("endpoints %q, want %s", out, backend)
		}
		return nil
	})
	return strings.TrimSpace(mustKubectl(t, "-n", ns, "get", "svc", name, "-o", "jsonpath={.spec.clusterIP}"))
}

func podManifest(ns, name, mode string) string {
	return podManifestOn(ns, name, mode, node1(), nil)
}

// podManifestOn is podManifest on the given node, with extra labels.
func podManifestOn(ns, name, mode, nodeName string, labels map[string]string) string {
	lab := fmt.Sprintf("app: %q", name)
	for k, v := range labels {
		lab += fmt.Sprintf(", %s: %q", k, v)
	}
	ann := ""
	if mode != "" {
		ann = fmt.Sprintf("\n  annotations: {%s: %q}", gsoAnnotation, mode)
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: %q
  namespace: %q
  labels: {%s}%s
spec:
  nodeName: %q
  terminationGracePeriodSeconds: 1
  containers:
  - name: podtool
    image: %s
    imagePullPolicy: Never
    args: [serve]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
`, name, ns, lab, ann, nodeName, podImage)
}

func podExec(t *testing.T, ns, name string, argv ...string) string {
	t.Helper()
	out, err := kubectl(append([]string{"-n", ns, "exec", name, "--"}, argv...)...)
	if err != nil {
		t.Errorf("in pod %s: %v", name, err)
	}
	return out
}

// wantHTTP checks a podtool HTTP answer: which pod answered and, when
// client is set, the source address it saw.
func wantHTTP(t *testing.T, what, body, pod, client string) {
	t.Helper()
	if !strings.HasPrefix(body, "pod="+pod+" ") {
		t.Errorf("%s: answer %q, want one from pod %s", what, body, pod)
		return
	}
	if client != "" && !strings.Contains(body, "client="+net.JoinHostPort(client, "")) {
		t.Errorf("%s: answer %q, want the client address %s", what, body, client)
	}
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func udpEcho(addr, msg string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	// UDP may lose the first datagram while neighbours resolve: retry.
	for i := 0; i < 5; i++ {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			return "", err
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", addr)
}

func echo(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("long-lived connection, sending %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("long-lived connection, reading the echo of %q: %v", line, err)
	}
	if strings.TrimSuffix(got, "\n") != line {
		t.Fatalf("long-lived connection: echo %q, want %q", got, line)
	}
}

func containsIP(cidrs []string, ip string) bool {
	for _, c := range cidrs {
		if strings.SplitN(c, "/", 2)[0] == ip {
			return true
		}
	}
	return false
}

// agentPods lists the names of the DaemonSet's pods.
func agentPods(t *testing.T) []string {
	t.Helper()
	out := mustKubectl(t, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=cni-usernet",
		"-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}")
	return strings.Fields(out)
}

// waitNodesNotReady waits until the kubelet of each node has seen the
// CNI configuration gone (standalone mode's uninstall), so that what runs
// next (flannel, in e2e.sh's chain mode) does not meet a Ready that is only
// the kubelet's last report.
func waitNodesNotReady(t *testing.T) {
	t.Helper()
	for _, n := range []string{node1(), node2()} {
		if n == "" {
			continue
		}
		eventually(t, 2*time.Minute, "node "+n+" NotReady again", func() error {
			if ok, _ := getNode(t, n).ready(); ok {
				return fmt.Errorf("node %s still Ready", n)
			}
			return nil
		})
	}
}

func waitAgentGone(t *testing.T) {
	t.Helper()
	eventually(t, 2*time.Minute, "cni-usernet agent pods gone", func() error {
		if p := agentPods(t); len(p) > 0 {
			return fmt.Errorf("still running: %v", p)
		}
		return nil
	})
}

// checkMTU checks that a pod's stack runs with its link's MTU: the one the
// agent configured (standalone) or the one the primary CNI gave the link,
// flannel's overlay MTU (chained; flannel.sh runs VXLAN over a 1500-byte
// underlay: 1450).
func checkMTU(t *testing.T, ns, name string, row statusRow, chained, onNode2 bool) {
	t.Helper()
	out, err := kubectl("-n", ns, "exec", name, "--", "cat", "/sys/class/net/eth0/mtu")
	if err != nil {
		t.Errorf("%s: reading eth0's MTU: %v", name, err)
		return
	}
	// The pod's eth0 is the stack's TUN, whose MTU only sizes the
	// loopback segments between the applications and the stack; the
	// link's MTU is the one the stack took over with the link.
	tun, _ := strconv.Atoi(strings.TrimSpace(out))
	if tun != stackconfig.DefaultTUNMTU {
		t.Errorf("%s: eth0 (the stack's TUN) MTU %d, want %d", name, tun, stackconfig.DefaultTUNMTU)
	}
	link := row.mtu()
	if link == 0 {
		t.Errorf("%s: the stack reports no MTU for the pod's link", name)
	}
	if chained {
		if want := flannelMTU(t); link != want {
			t.Errorf("%s: the pod's link's MTU %d, flannel's overlay MTU %d", name, link, want)
		}
	} else if want, how := agentPodMTU(t, onNode2); link != want {
		t.Errorf("%s: the pod's link's MTU %d, the agent chose %d (%s)", name, link, want, how)
	} else {
		t.Logf("%s: the agent's choice of MTU: %d (%s)", name, want, how)
	}
	t.Logf("%s: link MTU %d (eth0, the TUN, %d), GSO %s (%s)", name, link, tun, row.GSO.Mode, row.GSO.Reason)
}

// agentPodMTU is the pods' MTU the agent of node 1 or node 2 chose, and
// how (its node-routes.json, standalone mode).
func agentPodMTU(t *testing.T, onNode2 bool) (int, string) {
	t.Helper()
	path := "/run/cni-usernet/node-routes.json"
	if onNode2 {
		path = filepath.Join(node2Dir("/run/cni-usernet"), "node-routes.json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the agent's node routes status: %v", err)
	}
	var st struct {
		PodMTU struct {
			MTU    int    `json:"mtu"`
			Source string `json:"source"`
		} `json:"podMTU"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.PodMTU.MTU == 0 {
		t.Fatalf("%s: no podMTU (%v):\n%s", path, err, b)
	}
	return st.PodMTU.MTU, st.PodMTU.Source
}

// flannelMTU is FLANNEL_MTU from node 1's /run/flannel/subnet.env.
func flannelMTU(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/run/flannel/subnet.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "FLANNEL_MTU="); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("subnet.env: %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no FLANNEL_MTU in /run/flannel/subnet.env:\n%s", b)
	return 0
}

// bulkEcho sends n random bytes to a podtool TCP echo and checks that the
// same bytes come back.
func bulkEcho(addr string, n int) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	data := make([]byte, n)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("after %d of %d bytes back: %w", len(got), n, err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%d bytes back, not the %d sent", len(got), n)
	}
	return nil
}

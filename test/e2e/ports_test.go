package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// The hostPorts of the HostPort check: high, so that nothing of the lab's
// listens there.
const (
	hostHTTPPort = 18080
	hostEchoPort = 19000
)

// hostPortPod is a podtool pod on nodeName with the given container
// ports (YAML flow mappings).
func hostPortPod(ns, name, nodeName string, ports ...string) string {
	m := podManifestOn(ns, name, "", nodeName, nil)
	return m + "    ports:\n    - " + strings.Join(ports, "\n    - ") + "\n"
}

func internalIP(t *testing.T, nodeName string) string {
	t.Helper()
	// (the first: a dual-stack node lists one per family, its primary first)
	f := strings.Fields(mustKubectl(t, "get", "node", nodeName, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`))
	if len(f) == 0 {
		t.Fatalf("node %s has no InternalIP", nodeName)
	}
	return f[0]
}

// deletePodsAfter deletes the check's pods when it ends, so that the
// checks after it count only theirs.
func deletePodsAfter(t *testing.T, ns string, names ...string) {
	t.Cleanup(func() {
		if _, err := kubectl(append([]string{"-n", ns, "delete", "pod", "--wait=true", "--timeout=2m"}, names...)...); err != nil {
			t.Errorf("deleting %v: %v", names, err)
		}
	})
}

// checkHostPort: a pod's hostPort, mapped by the portmap plugin chained
// after cni-usernet (or the primary's, chained behind flannel), reaches
// the pod's stack from the other node (the client's address kept) and
// from the node itself; two pods share hostPort 18080 on different
// hostIPs (the node's address and 127.0.0.1), and hostPort 19000 with
// different protocols.
func checkHostPort(t *testing.T, repo, ns string) {
	if node2() == "" {
		t.Skip("single-node lab (K8S_LAB_NODES=1): no other node")
	}
	ip1, ip2 := internalIP(t, node1()), internalIP(t, node2())
	var m strings.Builder
	m.WriteString(hostPortPod(ns, "hp-a", node1(),
		fmt.Sprintf("{containerPort: 8080, hostPort: %d, hostIP: %q, protocol: TCP}", hostHTTPPort, ip1),
		fmt.Sprintf("{containerPort: 9000, hostPort: %d, protocol: TCP}", hostEchoPort)))
	m.WriteString(hostPortPod(ns, "hp-b", node1(),
		fmt.Sprintf("{containerPort: 8080, hostPort: %d, hostIP: 127.0.0.1, protocol: TCP}", hostHTTPPort),
		fmt.Sprintf("{containerPort: 9090, hostPort: %d, protocol: UDP}", hostEchoPort)))
	m.WriteString(hostPortPod(ns, "hp-far", node2(),
		fmt.Sprintf("{containerPort: 8080, hostPort: %d, protocol: TCP}", hostHTTPPort)))
	apply(t, m.String())
	deletePodsAfter(t, ns, "hp-a", "hp-b", "hp-far")
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/hp-a", "pod/hp-b", "pod/hp-far", "--timeout=3m")

	url := func(ip string) string { return "http://" + net.JoinHostPort(ip, fmt.Sprint(hostHTTPPort)) + "/" }
	curlOnNode2 := func(u string) string {
		// The machine's curl, in node 2's namespaces.
		return onNode2(t, repo, "curl", "-s", "--max-time", "10", u)
	}
	// From the other node: the pod sees node 2's address (no SNAT).
	wantHTTP(t, "node 2 -> hostIP "+ip1, curlOnNode2(url(ip1)), "hp-a", ip2)
	wantHTTP(t, "node 1 -> hostPort on node 2", mustGet(t, url(ip2)), "hp-far", ip1)
	// From the node itself, on each hostIP.
	wantHTTP(t, "node 1 -> own hostIP "+ip1, mustGet(t, url(ip1)), "hp-a", ip1)
	wantHTTP(t, "node 1 -> hostIP 127.0.0.1", mustGet(t, url("127.0.0.1")), "hp-b", "")
	wantHTTP(t, "node 2 -> own hostPort", curlOnNode2(url(ip2)), "hp-far", "")
	// From a pod on node 1 to node 2's hostPort.
	wantHTTP(t, "cli (node 1) -> hostPort on node 2", podExec(t, ns, "cli", "timeout", "15", "wget", "-qO-", url(ip2)), "hp-far", "")
	// One port, two protocols, two pods.
	echoAddr := net.JoinHostPort(ip1, fmt.Sprint(hostEchoPort))
	if err := bulkEcho(echoAddr, 1<<20); err != nil {
		t.Errorf("TCP hostPort %s (hp-a's echo): %v", echoAddr, err)
	}
	if reply, err := udpEcho(echoAddr, "hello-hostport"); err != nil {
		t.Errorf("UDP hostPort %s: %v", echoAddr, err)
	} else if !strings.HasPrefix(reply, "pod=hp-b ") {
		t.Errorf("UDP hostPort %s: reply %q, want hp-b's", echoAddr, reply)
	}
}

func mustGet(t *testing.T, url string) string {
	t.Helper()
	body, err := httpGet(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
	}
	return body
}

// The shaped pod's annotations, in bits per second.
const (
	e2eIngress = 10_000_000
	e2eEgress  = 50_000_000
)

// checkBandwidth: a pod's kubernetes.io/ingress-bandwidth (10M) and
// egress-bandwidth (50M) annotations, which the runtime passes to
// cni-usernet (standalone) or to the bandwidth plugin chained before it,
// shape its traffic within
// ±10 % once the runtime's burst is spent, as podtool's sink and source
// on node 1 see it.
func checkBandwidth(t *testing.T, ns, network string) {
	m := podManifest(ns, "shaped", "")
	m = strings.Replace(m, "  labels:", "  annotations: {kubernetes.io/ingress-bandwidth: 10M, kubernetes.io/egress-bandwidth: 50M}\n  labels:", 1)
	apply(t, m)
	deletePodsAfter(t, ns, "shaped")
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/shaped", "--timeout=3m")
	ip := getPod(t, ns, "shaped").Status.PodIP

	// The qdiscs: on the node end of the pod's veth (the link the node
	// guards the pod's sources on) a tbf; chained, the bandwidth plugin's
	// ingress qdisc to its ifb beside it; standalone, cni-usernet's tbf on
	// the pod end, in the stack's namespace.
	var att *state.Attachment
	for _, a := range readNodeState(t, network).atts {
		if a.PodNS == ns && a.PodName == "shaped" {
			att = a
		}
	}
	if att == nil || att.SourceGuard == "" {
		t.Fatalf("no attachment of %s/shaped with a node-side link on this node", ns)
	}
	out, _ := exec.Command("tc", "qdisc", "show", "dev", att.SourceGuard).CombinedOutput()
	if !strings.Contains(string(out), "tbf") || (att.Chained && !strings.Contains(string(out), "ingress")) {
		t.Errorf("%s: qdiscs\n%s\nwant a tbf (ingress shaping) and, chained, an ingress qdisc (to the ifb)", att.SourceGuard, out)
	}
	t.Logf("%s: %s", att.SourceGuard, strings.TrimSpace(string(out)))
	if !att.Chained {
		out, _ := exec.Command("nsenter", "--net="+att.WireNetns, "tc", "qdisc", "show", "dev", att.IfName).CombinedOutput()
		if !strings.Contains(string(out), "tbf") {
			t.Errorf("%s in the stack's namespace: qdiscs\n%s\nwant a tbf (egress shaping)", att.IfName, out)
		}
	}

	const seconds = 20
	for _, dir := range []struct {
		name   string
		target float64
		run    func() ([]float64, error)
	}{
		{"ingress (node 1 -> pod)", e2eIngress, func() ([]float64, error) { return sendTo(net.JoinHostPort(ip, "9001"), seconds) }},
		{"egress (pod -> node 1)", e2eEgress, func() ([]float64, error) { return receiveFrom(net.JoinHostPort(ip, "9002"), seconds) }},
	} {
		rates, err := dir.run()
		if err != nil {
			t.Errorf("%s: %v", dir.name, err)
			continue
		}
		mean, burst, err := nettest.SteadyRate(rates, dir.target)
		if err != nil {
			t.Errorf("%s: %v", dir.name, err)
			continue
		}
		ratio := mean / dir.target
		t.Logf("%s: %.2f Mbit/s steady, %.3f of the annotation's %.0f Mbit/s (burst %d s)", dir.name, mean/1e6, ratio, dir.target/1e6, len(burst))
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s: %.2f Mbit/s, want %.0f ± 10 %% (per second: %.0f)", dir.name, mean/1e6, dir.target/1e6, rates)
		}
	}
}

// sendTo sends to podtool's sink for seconds and returns the rates per
// second (bits/s) the sink received.
func sendTo(addr string, seconds int) ([]float64, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	for time.Now().Before(end) {
		c.SetWriteDeadline(end)
		if _, err := c.Write(buf); err != nil && !isTimeout(err) {
			return nil, fmt.Errorf("sending: %w", err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	// What is queued drains at the shaped rate: a few MB at 10 Mbit/s.
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	var perSecond []int64
	if err := json.NewDecoder(c).Decode(&perSecond); err != nil {
		return nil, fmt.Errorf("reading the sink's counts: %w", err)
	}
	// The last second is partial (the end of the queue).
	if len(perSecond) > 1 {
		perSecond = perSecond[:len(perSecond)-1]
	}
	rates := make([]float64, len(perSecond))
	for i, n := range perSecond {
		rates[i] = float64(n) * 8
	}
	return rates, nil
}

// receiveFrom asks podtool's source to send for seconds and returns the
// rates per second (bits/s) received here.
func receiveFrom(addr string, seconds int) ([]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+30)*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Duration(seconds+30) * time.Second))
	fmt.Fprintf(c, "%d\n", seconds)
	var perSecond []int64
	var start time.Time
	buf := make([]byte, 256<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			now := time.Now()
			if start.IsZero() {
				start = now
			}
			i := int(now.Sub(start) / time.Second)
			for len(perSecond) <= i {
				perSecond = append(perSecond, 0)
			}
			perSecond[i] += int64(n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(perSecond) > 1 {
		perSecond = perSecond[:len(perSecond)-1]
	}
	rates := make([]float64, len(perSecond))
	for i, n := range perSecond {
		rates[i] = float64(n) * 8
	}
	return rates, nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

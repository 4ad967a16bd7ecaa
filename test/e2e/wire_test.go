package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/test/lib/attack"
)

// The ports of TestKubernetesWire, as in test/hostile's rig: the victim
// admits the attackers on wireVictimUDP and wireVictimTCP, which their
// egress policy denies, and only the peer on wireGuardedUDP and
// wireGuardedTCP, which their egress policy allows; the node serves
// wireNodeUDP and wireNodeTCP (on its own address), which their egress
// policy denies. The attackers' podtool serves UDP echo on 9090, which
// only the peer may reach.
const (
	wireVictimUDP  = 7070
	wireVictimTCP  = 7071
	wireGuardedUDP = 7072
	wireGuardedTCP = 7073
	wireNodeUDP    = 7074
	wireNodeTCP    = 7075
	wireSniffUDP   = 9090
)

// TestKubernetesWire is test/hostile's TestWire on the real cluster: the
// hostile pod is podtool (test/lib/attack) in a pod with the runtime's
// default capabilities ("attacker") and in one whose securityContext adds
// NET_ADMIN ("attacker-admin"), beside a victim and a peer on node 1, with
// NetworkPolicies as in the rig there, run with kubectl exec. Every
// attack must fail: nothing reaches the victim's application (podtool
// attack record) or its link (read from node 1's side of its veth),
// nothing reaches the node's server on its address (this test, on node
// 1) or draws its TCP's answer, no ARP or NDP claim enters node 1's
// neighbour table, no link but lo and a TUN is seen, no link is created
// that carries anything, moved out, or made in another namespace, and no
// packet socket reads the traffic the pod's ingress policy denies.
//
// Standalone mode only, on a cluster without cni-usernet, as
// TestKubernetesFaults. Node 1 is this machine: the test only reads its
// namespaces (a packet socket on the pods' veths, the neighbour table)
// and listens on its address, which lives on lo; the attackers' foreign
// namespace writes are off (attack.Spec.ForeignWrites).
func TestKubernetesWire(t *testing.T) {
	_, ns, network := faultsSetup(t, "cu-wire-")
	node := node1()
	nodeIP, err := netip.ParseAddr(internalIP(t, node))
	if err != nil {
		t.Fatalf("node %s's address: %v", node, err)
	}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	base := "cuatk-" + hex.EncodeToString(suffix)

	pods := []struct{ name, role, caps string }{
		{"attacker", "attacker", ""},
		{"attacker-admin", "attacker", "NET_ADMIN"},
		{"victim", "victim", ""},
		{"peer", "peer", ""},
	}
	var m strings.Builder
	for _, p := range pods {
		m.WriteString(wirePod(ns, p.name, p.role, node, p.caps))
	}
	m.WriteString(wirePolicies(ns))
	apply(t, m.String())
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m")
	addrs := map[string]attack.Pair{}
	for _, p := range pods {
		addrs[p.name] = podPair(t, ns, p.name)
	}
	t.Logf("pods: %v, node %s %s", addrs, node, nodeIP)
	waitPolicies(t, ns, map[string][2]bool{"attacker": {true, true}, "attacker-admin": {true, true}, "victim": {true, false}})

	// Node 1's side: its server on its address, and its ends of the
	// pods' veths.
	nodeApp := attack.NewRecorder(base)
	t.Cleanup(nodeApp.Close)
	for _, err := range []error{
		nodeApp.ListenUDP(netip.AddrPortFrom(nodeIP, wireNodeUDP).String()),
		nodeApp.ListenTCP(netip.AddrPortFrom(nodeIP, wireNodeTCP).String()),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	veths := map[string]*attack.Watch{}
	netnsOf := map[string]string{} // as /proc/PID/ns/net reads: "net:[inode]"
	st := readNodeState(t, network)
	for _, p := range pods {
		a := st.attachmentOf(ns, p.name)
		if a == nil || a.HostVeth == "" {
			t.Fatalf("%s: no attachment with a node-side veth in the node's state", p.name)
		}
		var sb syscall.Stat_t
		if err := syscall.Stat(a.Netns, &sb); err != nil {
			t.Fatalf("%s's network namespace: %v", p.name, err)
		}
		netnsOf[p.name] = fmt.Sprintf("net:[%d]", sb.Ino)
		l, err := net.InterfaceByName(a.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		w, err := attack.NewWatch(a.HostVeth, l.Index, base)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		veths[p.name] = w
	}
	spec := func(marker, attacker string, attacks ...string) attack.Spec {
		return attack.Spec{
			Attacks: attacks, Marker: marker,
			Self:     addrs[attacker],
			NodeAddr: attack.Pair{V4: nodeIP},
			NodeUDP:  wireNodeUDP, NodeTCP: wireNodeTCP,
			Victim: addrs["victim"], VictimUDP: wireVictimUDP, VictimTCP: wireVictimTCP,
			Guarded: addrs["victim"], GuardedUDP: wireGuardedUDP, GuardedTCP: wireGuardedTCP,
			Peer:   addrs["peer"],
			Hidden: []string{"/run/cni-usernet", "/var/lib/cni-usernet", "/run/netns", "/var/run/netns", "/etc/cni/net.d"},
		}
	}

	t.Run("Controls", func(t *testing.T) {
		rec := startRecord(t, ns, "victim", base)
		var ok, denied []string
		for _, fam := range []int{4, 6} {
			v, p, a := addrs["victim"].V4, addrs["peer"].V4, addrs["attacker"].V4
			if fam == 6 {
				v, p, a = addrs["victim"].V6, addrs["peer"].V6, addrs["attacker"].V6
			}
			if !v.IsValid() || !p.IsValid() || !a.IsValid() {
				continue
			}
			m := fmt.Sprintf("%s-control/peer-udp%d", base, fam)
			ok = append(ok, m)
			podSend(t, ns, "peer", m, netip.AddrPortFrom(v, wireGuardedUDP))
			for _, c := range []struct {
				what string
				to   netip.AddrPort
			}{{"app-udp", netip.AddrPortFrom(v, wireVictimUDP)}, {"app-guarded-udp", netip.AddrPortFrom(v, wireGuardedUDP)}} {
				m := fmt.Sprintf("%s-control/%s%d", base, c.what, fam)
				denied = append(denied, m)
				podSend(t, ns, "attacker", m, c.to)
			}
		}
		toNode := base + "-control/app-node-udp4"
		podSend(t, ns, "attacker", toNode, netip.AddrPortFrom(nodeIP, wireNodeUDP))
		time.Sleep(time.Second)
		seen := rec.stop(t)
		for _, m := range ok {
			if _, got := seen[m]; !got || !veths["victim"].Delivered(m) {
				t.Errorf("%s: the victim's application got it %v, the node delivered it into its link %v; want both: the observers are blind",
					m, got, veths["victim"].Delivered(m))
			}
		}
		for _, m := range denied {
			if how, got := seen[m]; got {
				t.Errorf("%s: the victim's application got it (%s); want the policies to drop it", m, how)
			}
		}
		if how, got := nodeApp.Saw(toNode); got {
			t.Errorf("%s: the node's server got it (%s); want the attacker's egress policy to drop it", toNode, how)
		}
		if t.Failed() {
			t.Fatal("the policies or the observers are not as the attacks' verdicts assume")
		}
	})

	for i, attacker := range []string{"attacker", "attacker-admin"} {
		t.Run(attacker, func(t *testing.T) {
			marker := base + "-" + attacker
			// The confinement first: what the attacks say rests on it.
			ok := t.Run("self", func(t *testing.T) {
				for _, o := range podAttack(t, ns, attacker, spec(marker, attacker, attack.Self), nil) {
					t.Log(o)
					checkAttackerConfinement(t, o, attacker == "attacker-admin", netnsOf[attacker])
				}
			})
			if !ok {
				t.Fatal("the attacker does not run as the runtime runs a container's process")
			}
			rec := startRecord(t, ns, "victim", base)
			outcomes := podAttack(t, ns, attacker, spec(marker, attacker, attack.Links, attack.Egress, attack.Spoof,
				attack.Node, attack.NewLink, attack.Move, attack.Foreign, attack.TUN), nil)
			time.Sleep(500 * time.Millisecond)
			seen := rec.stop(t)
			arrived := func(o attack.Outcome) []string {
				var how []string
				if s, ok := seen[o.Marker]; ok {
					how = append(how, "the victim's application got it ("+s+")")
				}
				if veths["victim"].Delivered(o.Marker) {
					how = append(how, "node 1 delivered it into the victim's link")
				} else if strings.Contains(o.Case, "syn") && o.Src.Port() != 0 {
					if from, ok := veths["victim"].SYNTo(o.Dst, o.Src.Port()); ok {
						how = append(how, fmt.Sprintf("node 1 delivered a SYN from %s into the victim's link", from))
					}
				}
				return how
			}
			for _, o := range outcomes {
				t.Run(o.Attack+"_"+strings.ReplaceAll(o.Case, "/", "_"), func(t *testing.T) {
					t.Log(o)
					for _, s := range o.Reached {
						t.Errorf("%s: the attacker %s; want nothing", o.Case, s)
					}
					switch o.Attack {
					case attack.Egress, attack.Spoof, attack.NewLink:
						if how := arrived(o); o.Marker != "" && len(how) > 0 {
							t.Errorf("%s %s -> %s: arrived (%s); want it dropped", o.Case, o.Src, o.Dst, strings.Join(how, "; "))
						}
					case attack.Node:
						if how, ok := nodeApp.Saw(o.Marker); o.Marker != "" && ok {
							t.Errorf("%s %s -> %s: node 1's server got it (%s); want it dropped", o.Case, o.Src, o.Dst, how)
						}
						if o.Dst.Port() == wireNodeTCP && veths[attacker].Answered(uint8(syscall.IPPROTO_TCP), o.Src, o.Dst) {
							t.Errorf("%s %s -> %s: node 1 answered the SYN; want it dropped before the node's TCP", o.Case, o.Src, o.Dst)
						}
					}
				})
			}
			t.Run("neigh", func(t *testing.T) { wireNeigh(t, ns, attacker, i, spec(marker, attacker, attack.Neigh)) })
			t.Run("sniff", func(t *testing.T) {
				s := spec(marker, attacker, attack.Sniff)
				// Long enough for two kubectl execs to start and send.
				s.SniffFor = attack.Duration(8 * time.Second)
				self := addrs[attacker]
				var allowed, denied []string
				var wg sync.WaitGroup
				outcomes := podAttack(t, ns, attacker, s, func(o attack.Outcome) {
					if o.Case != "listening" {
						return
					}
					for _, to := range []netip.Addr{self.V4, self.V6} {
						if !to.IsValid() {
							continue
						}
						fam := 4
						if to.Is6() {
							fam = 6
						}
						a := fmt.Sprintf("%s/sniffed/peer-udp%d", marker, fam)
						d := fmt.Sprintf("%s/sniffed/victim-udp%d", marker, fam)
						allowed, denied = append(allowed, a), append(denied, d)
						for _, from := range []struct{ pod, m string }{{"peer", a}, {"victim", d}} {
							wg.Add(1)
							go func() {
								defer wg.Done()
								podSend(t, ns, from.pod, from.m, netip.AddrPortFrom(to, wireSniffUDP))
							}()
						}
					}
				})
				wg.Wait()
				seenBy := map[string][]string{}
				for _, o := range outcomes {
					t.Log(o)
					for _, s := range o.Seen {
						m, where, _ := strings.Cut(s, "@")
						seenBy[m] = append(seenBy[m], fmt.Sprintf("socket %s read it on %s", o.Case, where))
					}
				}
				if len(allowed) == 0 {
					t.Fatal("the sniffer never said it was listening")
				}
				for _, m := range allowed {
					if len(seenBy[m]) == 0 {
						t.Errorf("%s: no packet socket read the allowed peer's datagram: a sniffer that sees nothing proves nothing", m)
					}
				}
				for _, m := range denied {
					if len(seenBy[m]) > 0 {
						t.Errorf("%s: the victim's datagram, which the pod's ingress policy denies, was read in the pod: %s; want it never in the pod's namespace",
							m, strings.Join(seenBy[m], "; "))
					}
				}
			})
		})
	}
}

// wirePod is a podtool pod with a role label, on nodeName, with a
// capability added when caps is set.
func wirePod(ns, name, role, nodeName, caps string) string {
	m := podManifestOn(ns, name, "", nodeName, map[string]string{"role": role})
	if caps != "" {
		m = strings.Replace(m, "    args: [serve]\n", fmt.Sprintf("    args: [serve]\n    securityContext: {capabilities: {add: [%s]}}\n", caps), 1)
	}
	return m
}

// wirePolicies are the rig's policies: the attackers admit the peer alone
// and reach the peer and the victim's guarded ports alone; the victim
// admits the peer, and the attackers on its victim ports.
func wirePolicies(ns string) string {
	return fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: attackers, namespace: %[1]q}
spec:
  podSelector: {matchLabels: {role: attacker}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: peer}}}]
  egress:
  - to: [{podSelector: {matchLabels: {role: peer}}}]
  - to: [{podSelector: {matchLabels: {role: victim}}}]
    ports: [{protocol: UDP, port: %[2]d}, {protocol: TCP, port: %[3]d}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: victim, namespace: %[1]q}
spec:
  podSelector: {matchLabels: {role: victim}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: peer}}}]
  - from: [{podSelector: {matchLabels: {role: attacker}}}]
    ports: [{protocol: UDP, port: %[4]d}, {protocol: TCP, port: %[5]d}]
`, ns, wireGuardedUDP, wireGuardedTCP, wireVictimUDP, wireVictimTCP)
}

// podPair reads a pod's addresses.
func podPair(t *testing.T, ns, name string) attack.Pair {
	t.Helper()
	var p attack.Pair
	for _, ip := range getPod(t, ns, name).Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			t.Fatalf("%s: pod IP %q: %v", name, ip.IP, err)
		}
		if a.Is4() {
			p.V4 = a
		} else {
			p.V6 = a
		}
	}
	if !p.V4.IsValid() && !p.V6.IsValid() {
		t.Fatalf("%s has no pod IP", name)
	}
	return p
}

// waitPolicies waits until each pod's stack on node 1 holds a policy that
// isolates ingress and egress as given (the agent has pushed it).
func waitPolicies(t *testing.T, ns string, want map[string][2]bool) {
	t.Helper()
	eventually(t, time.Minute, "the policies in force in the stacks", func() error {
		for name, w := range want {
			sock, err := stackSocketOf(stateDir, "/run/cni-usernet", ns, name)
			if err != nil {
				return err
			}
			resp, err := unixClient(sock).Get("http://stack/status")
			if err != nil {
				return err
			}
			var st struct {
				Policy *struct {
					IngressIsolated bool `json:"ingressIsolated"`
					EgressIsolated  bool `json:"egressIsolated"`
				} `json:"policy"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if st.Policy == nil || st.Policy.IngressIsolated != w[0] || st.Policy.EgressIsolated != w[1] {
				return fmt.Errorf("%s: policy %+v, want ingress isolated %v, egress isolated %v", name, st.Policy, w[0], w[1])
			}
		}
		return nil
	})
	// Each pod's policy comes in one push; give the agent a moment in
	// case it compiled a selector before it knew every pod.
	time.Sleep(2 * time.Second)
}

// podSend sends a few datagrams carrying marker from a pod.
func podSend(t *testing.T, ns, pod, marker string, to netip.AddrPort) {
	t.Helper()
	if out, err := kubectl("-n", ns, "exec", pod, "--", "/podtool", "attack", "send", marker, "3", "udp:"+to.String()); err != nil {
		t.Errorf("sending from %s to %s: %v: %s", pod, to, err, out)
	}
}

// podRecord is podtool attack record running in a pod.
type podRecord struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startRecord serves the rig's victim ports in pod until stop.
func startRecord(t *testing.T, ns, pod, base string) *podRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, "kubectl", "-n", ns, "exec", "-i", pod, "--", "/podtool", "attack", "record", base,
		fmt.Sprintf("udp:%d", wireVictimUDP), fmt.Sprintf("tcp:%d", wireVictimTCP),
		fmt.Sprintf("udp:%d", wireGuardedUDP), fmt.Sprintf("tcp:%d", wireGuardedTCP))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &podRecord{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := r.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		t.Fatalf("podtool attack record in %s: %q, %v", pod, line, err)
	}
	return r
}

// stop ends the recorder and returns the markers it saw, and how.
func (r *podRecord) stop(t *testing.T) map[string]string {
	t.Helper()
	r.stdin.Close()
	line, rerr := r.out.ReadString('\n')
	r.cmd.Wait()
	seen := map[string]string{}
	if err := json.Unmarshal([]byte(line), &seen); err != nil {
		t.Fatalf("podtool attack record's markers %q (%v): %v", line, rerr, err)
	}
	return seen
}

// podAttack runs podtool attack run in pod, handing each outcome to each
// as it arrives, and returns them all.
func podAttack(t *testing.T, ns, pod string, spec attack.Spec, each func(attack.Outcome)) []attack.Outcome {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", "-n", ns, "exec", pod, "--", "/podtool", "attack", "run", string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var all []attack.Outcome
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		outcomes, other := attack.Decode(sc.Bytes())
		for _, l := range other {
			t.Logf("%s: %s", pod, l)
		}
		for _, o := range outcomes {
			all = append(all, o)
			if each != nil {
				each(o)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("podtool attack run in %s: %v: %s", pod, err, stderr.String())
	}
	return all
}

// checkAttackerConfinement checks that the attacker ran as the runtime
// runs a container's process: root, with CAP_NET_RAW, with CAP_NET_ADMIN
// exactly when its pod asked for it, without CAP_SYS_ADMIN, in its pod's
// network namespace and a pid namespace of its own, seeing none of the
// node's paths.
func checkAttackerConfinement(t *testing.T, o attack.Outcome, admin bool, netns string) {
	t.Helper()
	c := o.Self
	if c == nil {
		t.Fatalf("no confinement report: %s", o)
	}
	has := func(name string) bool {
		m, _ := attack.CapMask(name)
		return c.Effective&m != 0
	}
	if c.UID != 0 || !has("net_raw") || has("net_admin") != admin || has("sys_admin") {
		t.Errorf("uid %d, capabilities %v; want root with net_raw, net_admin %v, no sys_admin", c.UID, c.Caps, admin)
	}
	if c.NetNS != netns {
		t.Errorf("network namespace: got %s, want the pod's %s", c.NetNS, netns)
	}
	if ours, _ := os.Readlink("/proc/self/ns/pid"); c.PidNS == ours {
		t.Errorf("pid namespace: the node's own %s; want the pod's", ours)
	}
	if len(c.Visible) > 0 {
		t.Errorf("the attacker sees the node's %v", c.Visible)
	}
}

// wireNeigh sends the ARP and NDP claims one at a time, each with a
// link-layer address of its own (the test does not clear node 1's table
// between them), and reads node 1's neighbour table after each.
func wireNeigh(t *testing.T, ns, attacker string, n int, spec attack.Spec) {
	for j, nc := range attack.NeighCases {
		spec.NeighCase = nc
		spec.NeighMAC = fmt.Sprintf("02:a7:7a:c4:%02x:%02x", n, j)
		outcomes := podAttack(t, ns, attacker, spec, nil)
		time.Sleep(200 * time.Millisecond)
		for _, o := range outcomes {
			t.Run(strings.ReplaceAll(o.Case, "/", "_"), func(t *testing.T) {
				t.Log(o)
				if !o.Claimed.IsValid() {
					return
				}
				fam := netlink.FAMILY_V4
				if o.Claimed.Is6() {
					fam = netlink.FAMILY_V6
				}
				entries, err := netlink.NeighList(0, fam)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					if a, ok := netip.AddrFromSlice(e.IP); ok && a.Unmap() == o.Claimed && e.HardwareAddr.String() == o.MAC {
						t.Errorf("%s: node 1's neighbour table holds %s at %s (link %d); want the claim ignored", o.Case, o.Claimed, o.MAC, e.LinkIndex)
					}
				}
			})
		}
		// A claim may not override one learnt within the neighbour
		// table's lock time (a second): wait it out.
		time.Sleep(time.Second)
	}
}

// Package policy holds the root tests of NetworkPolicy in the pod's own
// stack (docs/policy.md): a pod attached by the real plugin with
// "networkPolicy": true, policies pushed over its control socket as the
// node agent pushes them, and real clients and servers in peer pods'
// namespaces (attached by ptp: kernel pods) and in the node's.
package policy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/cni-usernet/cni-usernet/test/lib/standin"
)

const cniVersion = "1.1.0"

// Ports the policy pod and the peers serve on: TCP echo on tcpPort and
// tcpPort2, UDP echo on udpPort.
const (
	tcpPort  = 8080
	tcpPort2 = 9090
	udpPort  = 5353
)

// blockWait is how long a denied client waits for an answer that must
// not come; an allowed one waits up to allowWait (the machine may be
// loaded).
const (
	blockWait = time.Second
	allowWait = 5 * time.Second
)

func waitFor(allowed bool) time.Duration {
	if allowed {
		return allowWait
	}
	return blockWait
}

// rig is a pod whose stack enforces policy, two kernel peers (allowed and
// denied, as the policies below make them) and the node.
type rig struct {
	env            *nettest.Env
	pod            *nettest.Pod
	allowed, other *nettest.Pod
	att            *state.Attachment
	// n counts pushes, for increasing generations.
	n uint64
}

func newRig(t *testing.T) *rig {
	t.Helper()
	env := nettest.NewEnv(t)
	r := &rig{env: env}
	standin.Agent(t, env)
	r.pod = env.NewPod(env.Conf(cniVersion, map[string]any{"networkPolicy": true}))
	peerConf := env.Conf(cniVersion, map[string]any{"type": "ptp", "stateDir": nil, "logDir": nil, "runDir": nil})
	r.allowed = env.NewPodWith("ptp", peerConf)
	r.other = env.NewPodWith("ptp", peerConf)
	for _, ns := range []ns.NetNS{r.pod.NS, r.allowed.NS, r.other.NS, env.Node} {
		nettest.Serve(nettest.Listen(t, ns, "tcp", fmt.Sprint(":", tcpPort)), nettest.Echo)
		nettest.Serve(nettest.Listen(t, ns, "tcp", fmt.Sprint(":", tcpPort2)), nettest.Echo)
		go udpEcho(nettest.ListenUDP(t, ns, fmt.Sprint(":", udpPort)))
	}
	var err error
	if r.att, err = (state.Store{Dir: filepath.Join(env.Dir, "state")}).Load(r.pod.ID, "eth0"); err != nil {
		t.Fatal(err)
	}
	return r
}

func udpEcho(c *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// push puts p in force as the agent does: the file first, then the
// control socket.
func (r *rig) push(t *testing.T, p *policy.PodPolicy) {
	t.Helper()
	r.n++
	p.Version, p.Generation = policy.FormatVersion, 100+r.n
	if err := policy.WriteFile(r.policyPath(), p); err != nil {
		t.Fatal(err)
	}
	g, err := control.PutPolicy(r.att.ControlSocket, 5*time.Second, p)
	if err != nil {
		t.Fatalf("pushing generation %d: %v", p.Generation, err)
	}
	if g != p.Generation {
		t.Fatalf("push: stack answered generation %d, want %d", g, p.Generation)
	}
}

func (r *rig) policyPath() string {
	return attachment.PathsFor(filepath.Join(r.env.Dir, "state"), "", "", r.pod.ID, "eth0").Policy
}

func (r *rig) status(t *testing.T) control.Status {
	t.Helper()
	var st control.Status
	if err := control.FetchStatus(r.att.ControlSocket, 5*time.Second, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// node is the node's addresses as the agent names them.
func (r *rig) node() []netip.Addr { return []netip.Addr{r.pod.Gateway(4), r.pod.Gateway(6)} }

func hostCIDR(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// ingressOnly isolates ingress with rules; egress stays open.
func (r *rig) ingressOnly(rules ...policy.Rule) *policy.PodPolicy {
	return &policy.PodPolicy{Node: r.node(),
		Ingress: policy.Direction{Isolated: true, Policies: []string{"test/in"}, Rules: rules}}
}

// egressOnly isolates egress with rules; ingress stays open.
func (r *rig) egressOnly(rules ...policy.Rule) *policy.PodPolicy {
	return &policy.PodPolicy{Node: r.node(),
		Egress: policy.Direction{Isolated: true, Policies: []string{"test/out"}, Rules: rules}}
}

// tcpEcho connects from netns to to:port, waiting up to wait, and has one
// line echoed.
func tcpEcho(from ns.NetNS, to netip.Addr, port int, wait time.Duration) error {
	c, err := nettest.Dial(from, "tcp", nettest.HostPort(to, port), wait)
	if err != nil {
		return err
	}
	defer c.Close()
	return echoOnce(c)
}

func echoOnce(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("policy\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	return nil
}

// udpEchoed sends one datagram from netns to to:port and waits up to
// wait for it back.
func udpEchoed(from ns.NetNS, to netip.Addr, port int, wait time.Duration) error {
	c, err := nettest.Dial(from, "udp", nettest.HostPort(to, port), wait)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte("policy")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	_, err = c.Read(buf)
	return err
}

func ping(from ns.NetNS, to netip.Addr, wait time.Duration) error {
	out, err := exec.Command("nsenter", "--net="+from.Path(), "ping", "-c", "1", "-W", fmt.Sprint(int(wait.Seconds())), to.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

// wantTCP checks that a connection from netns to to:port is echoed, or,
// when !allowed, that it gets nothing back: a timeout, not a refusal.
func wantTCP(t *testing.T, what string, from ns.NetNS, to netip.Addr, port int, allowed bool) {
	t.Helper()
	err := tcpEcho(from, to, port, waitFor(allowed))
	switch {
	case allowed && err != nil:
		t.Errorf("%s: TCP to %s: %v, want an echo", what, nettest.HostPort(to, port), err)
	case !allowed && err == nil:
		t.Errorf("%s: TCP to %s echoed, want it denied", what, nettest.HostPort(to, port))
	case !allowed && !timedOut(err):
		t.Errorf("%s: TCP to %s: %v, want a timeout (dropped, not refused)", what, nettest.HostPort(to, port), err)
	}
}

func wantUDP(t *testing.T, what string, from ns.NetNS, to netip.Addr, port int, allowed bool) {
	t.Helper()
	err := udpEchoed(from, to, port, waitFor(allowed))
	switch {
	case allowed && err != nil:
		t.Errorf("%s: UDP to %s: %v, want an echo", what, nettest.HostPort(to, port), err)
	case !allowed && err == nil:
		t.Errorf("%s: UDP to %s echoed, want it denied", what, nettest.HostPort(to, port))
	case !allowed && !timedOut(err):
		t.Errorf("%s: UDP to %s: %v, want a timeout (no port unreachable)", what, nettest.HostPort(to, port), err)
	}
}

func wantPing(t *testing.T, what string, from ns.NetNS, to netip.Addr, allowed bool) {
	t.Helper()
	if err := ping(from, to, waitFor(allowed)); (err == nil) != allowed {
		t.Errorf("%s: ping %s: %v, want allowed %v", what, to, err, allowed)
	}
}

// TestClosedUntilFirstPush: a stack that enforces policy and has no
// policy file starts closed but to the node, both directions, until the
// agent's first push.
func TestClosedUntilFirstPush(t *testing.T) {
	r := newRig(t)
	st := r.status(t)
	if st.Policy == nil || !st.Policy.IngressIsolated || !st.Policy.EgressIsolated || st.Policy.Generation != 0 {
		t.Fatalf("status before any push: got %+v, want generation 0, both directions isolated", st.Policy)
	}
	wantTCP(t, "node (kubelet's probes)", r.env.Node, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "node over IPv6", r.env.Node, r.pod.IP(6), tcpPort, true)
	wantPing(t, "node", r.env.Node, r.pod.IP(4), true)
	wantTCP(t, "peer", r.allowed.NS, r.pod.IP(4), tcpPort, false)
	wantTCP(t, "pod to peer", r.pod.NS, r.allowed.IP(4), tcpPort, false)
	r.push(t, &policy.PodPolicy{Node: r.node()})
	wantTCP(t, "peer after an open push", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "pod to peer after an open push", r.pod.NS, r.allowed.IP(4), tcpPort, true)
	if got := r.status(t).Policy; got.IngressIsolated || got.EgressIsolated || got.Generation != 101 {
		t.Errorf("status after the push: got %+v", got)
	}
}

// TestIngressDefaultDeny: an ingress policy without rules denies TCP, UDP
// and ping from everyone but the node, with nothing sent back, and counts
// the denials under the policy's name.
func TestIngressDefaultDeny(t *testing.T) {
	r := newRig(t)
	r.push(t, r.ingressOnly())
	for _, fam := range []int{4, 6} {
		what := fmt.Sprintf("peer IPv%d", fam)
		wantTCP(t, what, r.allowed.NS, r.pod.IP(fam), tcpPort, false)
		wantUDP(t, what, r.allowed.NS, r.pod.IP(fam), udpPort, false)
		wantPing(t, what, r.allowed.NS, r.pod.IP(fam), false)
		what = fmt.Sprintf("node IPv%d", fam)
		wantTCP(t, what, r.env.Node, r.pod.IP(fam), tcpPort, true)
		wantUDP(t, what, r.env.Node, r.pod.IP(fam), udpPort, true)
		wantPing(t, what, r.env.Node, r.pod.IP(fam), true)
	}
	// Egress is open: the pod reaches the peer, and the peer's answers get in.
	wantTCP(t, "pod to peer", r.pod.NS, r.allowed.IP(4), tcpPort, true)
	wantUDP(t, "pod to peer", r.pod.NS, r.allowed.IP(4), udpPort, true)
	wantPing(t, "pod to peer", r.pod.NS, r.allowed.IP(6), true)
	st := r.status(t).Policy
	if n := st.Denied.Ingress["test/in"]; n < 6 {
		t.Errorf("ingress denials counted under test/in: got %d, want ≥ 6 (%+v)", n, st.Denied)
	}
}

// TestIngressByCIDRAndPorts: rules by CIDR less except, by port, by port
// range (endPort), by protocol; whatever no rule allows is dropped.
func TestIngressByCIDRAndPorts(t *testing.T) {
	r := newRig(t)
	// The pod subnet less the other peer: the allowed peer is in.
	r.push(t, r.ingressOnly(
		policy.Rule{Policy: "test/in", Peers: []policy.Peer{
			{CIDR: netip.MustParsePrefix(r.env.Subnet), Except: []netip.Prefix{hostCIDR(r.other.IP(4))}},
			{CIDR: netip.MustParsePrefix(r.env.Subnet6), Except: []netip.Prefix{hostCIDR(r.other.IP(6))}},
		}, Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort}}},
	))
	for _, fam := range []int{4, 6} {
		wantTCP(t, fmt.Sprintf("peer in CIDR IPv%d", fam), r.allowed.NS, r.pod.IP(fam), tcpPort, true)
		wantTCP(t, fmt.Sprintf("peer in except IPv%d", fam), r.other.NS, r.pod.IP(fam), tcpPort, false)
	}
	wantTCP(t, "peer in CIDR, other port", r.allowed.NS, r.pod.IP(4), tcpPort2, false)
	wantUDP(t, "peer in CIDR, UDP", r.allowed.NS, r.pod.IP(4), udpPort, false)
	wantPing(t, "peer in CIDR, ping (no rule without ports)", r.allowed.NS, r.pod.IP(4), false)

	// A range (endPort) that holds tcpPort2 and not tcpPort; UDP by port.
	r.push(t, r.ingressOnly(
		policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}},
			Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort2 - 10, Last: tcpPort2 + 10}, {Protocol: policy.UDP, First: udpPort}}},
	))
	wantTCP(t, "port range", r.allowed.NS, r.pod.IP(4), tcpPort2, true)
	wantTCP(t, "below the range", r.allowed.NS, r.pod.IP(4), tcpPort, false)
	wantUDP(t, "UDP port", r.allowed.NS, r.pod.IP(4), udpPort, true)
	wantUDP(t, "UDP port, other peer", r.other.NS, r.pod.IP(4), udpPort, false)
	wantTCP(t, "IPv6 of the same peer (not in the rule)", r.allowed.NS, r.pod.IP(6), tcpPort2, false)

	// A rule without ports lets ping in too.
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(6))}}}))
	wantPing(t, "ping IPv6, rule without ports", r.allowed.NS, r.pod.IP(6), true)
	wantPing(t, "ping IPv4, not in the rule", r.allowed.NS, r.pod.IP(4), false)
}

// TestEgress: the applications' connections, flows and pings to peers
// the egress rules deny are dropped (the application's own connect times
// out); allowed ones pass, with their replies.
func TestEgress(t *testing.T) {
	r := newRig(t)
	r.push(t, r.egressOnly(policy.Rule{Policy: "test/out", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}},
		Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort}, {Protocol: policy.UDP, First: udpPort}}}))
	wantTCP(t, "to the allowed peer", r.pod.NS, r.allowed.IP(4), tcpPort, true)
	wantUDP(t, "UDP to the allowed peer (and its reply)", r.pod.NS, r.allowed.IP(4), udpPort, true)
	wantTCP(t, "other port of the allowed peer", r.pod.NS, r.allowed.IP(4), tcpPort2, false)
	wantTCP(t, "to the other peer", r.pod.NS, r.other.IP(4), tcpPort, false)
	wantUDP(t, "UDP to the other peer", r.pod.NS, r.other.IP(4), udpPort, false)
	wantTCP(t, "to the node (egress applies to it too)", r.pod.NS, r.pod.Gateway(4), tcpPort, false)
	wantPing(t, "ping the allowed peer (no rule without ports)", r.pod.NS, r.allowed.IP(4), false)
	// Ingress is open.
	wantTCP(t, "other peer in", r.other.NS, r.pod.IP(4), tcpPort, true)
	if n := r.status(t).Policy.Denied.Egress["test/out"]; n < 4 {
		t.Errorf("egress denials counted under test/out: got %d, want ≥ 4", n)
	}
	r.push(t, r.egressOnly(policy.Rule{Policy: "test/out", Peers: []policy.Peer{{CIDR: hostCIDR(r.other.IP(6))}}}))
	wantPing(t, "ping IPv6, rule without ports", r.pod.NS, r.other.IP(6), true)
	wantTCP(t, "IPv6 any port", r.pod.NS, r.other.IP(6), tcpPort2, true)
	wantTCP(t, "the previously allowed peer", r.pod.NS, r.allowed.IP(4), tcpPort, false)
}

// TestEstablishedSurvivesPolicyChange: the verdict is taken per new
// connection; one established before a policy that denies its peer keeps
// working, both ways.
func TestEstablishedSurvivesPolicyChange(t *testing.T) {
	r := newRig(t)
	r.push(t, &policy.PodPolicy{Node: r.node()})
	in, err := nettest.Dial(r.allowed.NS, "tcp", nettest.HostPort(r.pod.IP(4), tcpPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := nettest.Dial(r.pod.NS, "tcp", nettest.HostPort(r.allowed.IP(4), tcpPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, c := range []net.Conn{in, out} {
		if err := echoOnce(c); err != nil {
			t.Fatal(err)
		}
	}
	closed := r.ingressOnly()
	closed.Egress = policy.Direction{Isolated: true, Policies: []string{"test/out"}}
	r.push(t, closed)
	wantTCP(t, "new connection in", r.allowed.NS, r.pod.IP(4), tcpPort, false)
	wantTCP(t, "new connection out", r.pod.NS, r.allowed.IP(4), tcpPort, false)
	for i, c := range []net.Conn{in, out} {
		if err := echoOnce(c); err != nil {
			t.Errorf("established connection %d after the policy change: %v", i, err)
		}
	}
}

// TestServiceVIP: with egress isolated, a connection to a Service VIP
// that nothing routes is dialled by the stack to a backend the policy
// allows, and the application talks to the VIP; a VIP whose only backend
// is denied gets nothing.
func TestServiceVIP(t *testing.T) {
	r := newRig(t)
	vip := netip.MustParseAddrPort("10.96.7.10:80")
	vip6 := netip.MustParseAddrPort("[fd96::10]:53")
	closedVIP := netip.MustParseAddrPort("10.96.7.11:80")
	p := r.egressOnly(policy.Rule{Policy: "test/out", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}, {CIDR: hostCIDR(r.allowed.IP(6))}},
		Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort}, {Protocol: policy.UDP, First: udpPort}}})
	p.Services = []policy.Service{
		{Name: "test/web:http", Protocol: policy.TCP, VIP: vip, Backends: []policy.Backend{
			{Addr: netip.AddrPortFrom(r.other.IP(4), tcpPort)}, {Addr: netip.AddrPortFrom(r.allowed.IP(4), tcpPort)}}},
		{Name: "test/dns:dns", Protocol: policy.UDP, VIP: vip6, Backends: []policy.Backend{{Addr: netip.AddrPortFrom(r.allowed.IP(6), udpPort)}}},
		{Name: "test/closed:http", Protocol: policy.TCP, VIP: closedVIP, Backends: []policy.Backend{{Addr: netip.AddrPortFrom(r.other.IP(4), tcpPort)}}},
	}
	r.push(t, p)
	for range 5 { // whatever the flow hash, only the allowed backend
		wantTCP(t, "VIP", r.pod.NS, vip.Addr(), int(vip.Port()), true)
	}
	c, err := nettest.Dial(r.pod.NS, "tcp", vip.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != vip.String() {
		t.Errorf("application's peer: got %s, want the VIP %s", got, vip)
	}
	c.Close()
	wantUDP(t, "UDP VIP over IPv6", r.pod.NS, vip6.Addr(), int(vip6.Port()), true)
	wantTCP(t, "VIP without an allowed backend", r.pod.NS, closedVIP.Addr(), int(closedVIP.Port()), false)
	// Without the Services, the VIP is an address like any other: denied.
	p.Services = nil
	r.push(t, p)
	wantTCP(t, "VIP no longer known", r.pod.NS, vip.Addr(), int(vip.Port()), false)
}

// TestThousandRules: a 1,000-rule policy is taken and enforced; the last
// rule is the one that lets the peer in.
func TestThousandRules(t *testing.T) {
	r := newRig(t)
	p := r.ingressOnly()
	for i := range 999 {
		p.Ingress.Rules = append(p.Ingress.Rules, policy.Rule{Policy: "test/in", Peers: []policy.Peer{{
			CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 20 + byte(i/250), byte(i % 250), 0}), 24)}},
			Ports: []policy.PortRange{{Protocol: policy.TCP, First: uint16(20000 + i)}}})
	}
	p.Ingress.Rules = append(p.Ingress.Rules, policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}},
		Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort}}})
	r.push(t, p)
	wantTCP(t, "peer of the last rule", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "other peer", r.other.NS, r.pod.IP(4), tcpPort, false)
}

// TestBadPushKeepsPolicy: a push the stack cannot read (an unknown format
// version, an invalid rule) or one older than the policy in force is
// refused with the reason, and the policy in force stays.
func TestBadPushKeepsPolicy(t *testing.T) {
	r := newRig(t)
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}}}))
	inForce := r.status(t).Policy.Generation

	newer := *policy.Closed(nil)
	newer.Version, newer.Generation = policy.FormatVersion+1, inForce+10
	older := *policy.Closed(nil)
	older.Generation = inForce - 1
	invalid := *policy.Closed(nil)
	invalid.Generation = inForce + 10
	invalid.Ingress.Rules = []policy.Rule{{Ports: []policy.PortRange{{Protocol: policy.TCP, First: 90, Last: 80}}}}
	for _, c := range []struct {
		name   string
		p      *policy.PodPolicy
		status int
		reason string
	}{
		{"unknown format version", &newer, http.StatusBadRequest, "format version"},
		{"older generation", &older, http.StatusConflict, "older"},
		{"invalid port range", &invalid, http.StatusBadRequest, "bad port range"},
	} {
		_, err := control.PutPolicy(r.att.ControlSocket, 5*time.Second, c.p)
		var re *control.RefusedError
		if !errors.As(err, &re) || re.Status != c.status || !strings.Contains(re.Reason, c.reason) {
			t.Errorf("%s: got %v, want HTTP %d with %q", c.name, err, c.status, c.reason)
		}
	}
	if g := r.status(t).Policy.Generation; g != inForce {
		t.Errorf("generation after refused pushes: got %d, want %d", g, inForce)
	}
	wantTCP(t, "allowed peer, policy kept", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "other peer, policy kept", r.other.NS, r.pod.IP(4), tcpPort, false)
}

// TestRestartKeepsPolicy: a killed stack started again from its state, as
// the node agent restarts one, reads the policy file before its link is
// up and comes back with the policy it had.
func TestRestartKeepsPolicy(t *testing.T) {
	r := newRig(t)
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}}}))
	want := r.status(t).Policy.Generation
	old := launch.Process{PID: r.att.StackPID, StartTime: r.att.StackStartTime}
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); launch.Alive(old); {
		if time.Now().After(deadline) {
			t.Fatal("killed stack still alive")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The leader thread is a zombie before the other threads let go of
	// the TUN: until they have, the new stack cannot attach to it (EBUSY),
	// and is started again, as the agent's supervisor would.
	var proc launch.Process
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		proc, err = launch.Start(launch.Options{
			Binary:       r.att.StackBinary,
			Args:         launch.StackArgs(r.att.ConfigPath),
			Netns:        r.pod.NS.Path(),
			LogPath:      r.att.LogPath,
			ReadyTimeout: 20 * time.Second,
		})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "device or resource busy") || time.Now().After(deadline) {
			t.Fatalf("restarting the stack: %v", err)
		}
	}
	store := state.Store{Dir: filepath.Join(r.env.Dir, "state")}
	r.att.StackPID, r.att.StackStartTime = proc.PID, proc.StartTime
	if err := store.Save(r.att); err != nil { // DEL stops the new stack
		t.Fatal(err)
	}
	if st := r.status(t).Policy; st == nil || st.Generation != want || !st.IngressIsolated {
		t.Fatalf("restarted stack's policy: got %+v, want generation %d, ingress isolated", st, want)
	}
	wantTCP(t, "allowed peer after the restart", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "other peer after the restart", r.other.NS, r.pod.IP(4), tcpPort, false)
	wantTCP(t, "node after the restart", r.env.Node, r.pod.IP(4), tcpPort, true)
}

// TestAgentRestartKeepsPolicy: the node agent's supervisor restarts a
// killed stack from its configuration, and the new stack holds the
// policy the file says before it carries a frame.
func TestAgentRestartKeepsPolicy(t *testing.T) {
	r := newRig(t)
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}}}))
	want := r.status(t).Policy.Generation
	r.env.StartAgent(t, "--reconcile-interval", "1s")
	store := state.Store{Dir: filepath.Join(r.env.Dir, "state")}
	old := launch.Process{PID: r.att.StackPID, StartTime: r.att.StackStartTime}
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		att, err := store.Load(r.pod.ID, "eth0")
		if err == nil && att.StackPID != old.PID && launch.Alive(launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}) {
			var st control.Status
			if control.FetchStatus(att.ControlSocket, time.Second, &st) == nil && st.PID == att.StackPID {
				if st.Policy == nil || st.Policy.Generation != want || !st.Policy.IngressIsolated {
					t.Fatalf("restarted stack's policy: got %+v, want generation %d, ingress isolated", st.Policy, want)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not restart the stack within 20 s")
		}
	}
	wantTCP(t, "allowed peer after the restart", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "other peer after the restart", r.other.NS, r.pod.IP(4), tcpPort, false)
}

// TestPolicyOff: a stack that does not enforce policy refuses a push and
// reports no policy.
func TestPolicyOff(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	att, err := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	_, err = control.PutPolicy(att.ControlSocket, 5*time.Second, policy.Closed(nil))
	var re *control.RefusedError
	if !errors.As(err, &re) || re.Status != http.StatusConflict || !strings.Contains(re.Reason, "policy enforcement is off") {
		t.Fatalf("push to a stack without policy: got %v, want HTTP 409 policy enforcement is off", err)
	}
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 5*time.Second, &st); err != nil {
		t.Fatal(err)
	}
	if st.Policy != nil {
		t.Errorf("status of a stack without policy: got %+v, want none", st.Policy)
	}
	nettest.Serve(nettest.Listen(t, pod.NS, "tcp", fmt.Sprint(":", tcpPort)), nettest.Echo)
	wantTCP(t, "node", env.Node, pod.IP(4), tcpPort, true)
}

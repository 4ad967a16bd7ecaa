package hostile

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/cni-usernet/cni-usernet/test/lib/attack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// wireSettle is how long after an attacker exits its packets may still be on
// their way (it already waited a second for answers itself).
const wireSettle = 500 * time.Millisecond

// TestWire is the hostile pod of the threat model (DESIGN.md "The threat
// model and where the wire lives"): a process that runs as a container's
// does — root in the pod's network namespace, in a pid and mount
// namespace of its own where the node's /run and the stacks' files are
// hidden, with containerd's default capabilities (NetRaw: CAP_NET_RAW
// among them) or those and CAP_NET_ADMIN (NetAdmin) — attacks the pods
// beside it and the node (test/lib/attack). Every attack must fail, each in a
// subtest of its own:
//
//   - Links: the pod sees loopback and a TUN, no link to the wire.
//   - Egress: UDP and TCP SYNs to a pod the attacker's egress policy
//     denies, from a packet socket on every link and from a raw socket,
//     reach neither the victim's application nor the victim's link.
//   - Spoof: the same to ports of the victim that the attacker's egress
//     policy allows and the victim's ingress policy admits only the peer
//     to, from the peer's addresses, also from IP_HDRINCL/IPv6 raw
//     sockets and transparent sockets bound to the peer's address.
//   - Node: UDP and SYNs to the node's own address on ports the egress
//     policy denies: the node's server gets nothing, its TCP never answers.
//   - Neigh: ARP and NDP messages claiming the victim's addresses, one at
//     a time: the node's neighbour table never holds the claim.
//   - NewLink, Move, Foreign, TUN (NetAdmin): links of its own (veth;
//     macvlan and ipvlan on every link it sees) carry nothing to the
//     victim; no link can be moved into another namespace; the ids of
//     other namespaces give no way to their links; the stack's TUN takes
//     no second queue.
//   - Sniff: packet sockets on every link read nothing of the traffic its
//     ingress policy denies (from the victim, and frames the node sends
//     into its veth), while they do read what the allowed peer sends.
//
// Controls checks the observers and the policies: the allowed peer's
// traffic reaches the victim where the observers look, and the attacker's
// own applications, through their ordinary sockets, reach neither the
// victim (its egress policy denies some ports, the victim's ingress policy
// the others) nor the node's denied ports.
func TestWire(t *testing.T) {
	nettest.RequireRoot(t)
	for _, tool := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the attacker is started with %s (util-linux): %v", tool, err)
		}
	}
	r := newWireRig(t)
	t.Run("Controls", r.controls)
	// Both attackers try everything: what needs CAP_NET_ADMIN must fail
	// without it too.
	attacks := []string{attack.Links, attack.Egress, attack.Spoof, attack.Node,
		attack.NewLink, attack.Move, attack.Foreign, attack.TUN}
	for _, v := range []struct {
		name string
		caps []string
	}{
		{"NetRaw", containerCaps},
		{"NetAdmin", append(slices.Clone(containerCaps), "net_admin")},
	} {
		t.Run(v.name, func(t *testing.T) {
			if v.name == "NetAdmin" && testing.Short() {
				t.Skip("the CAP_NET_ADMIN attacker takes another 7 s; run without -short")
			}
			c := confinement{caps: v.caps, hide: []string{"/run", "/var/lib", r.env.Dir}}
			marker := r.base + "-" + strings.ToLower(v.name)
			// The confinement first: unconfined, Move would name the
			// test's own namespaces.
			ok := t.Run("Self", func(t *testing.T) {
				for _, o := range runAttack(t, r.attacker.NS, c, r.spec(marker, attack.Self), nil) {
					t.Log(o)
					r.checkConfinement(t, c, o)
				}
			})
			if !ok {
				t.Fatal("the attacker does not run as a container would: its results would say nothing")
			}
			outcomes := runAttack(t, r.attacker.NS, c, r.spec(marker, attacks...), nil)
			time.Sleep(wireSettle)
			for _, name := range attacks {
				t.Run(title(name), func(t *testing.T) {
					n := 0
					for _, o := range outcomes {
						if o.Attack != name {
							continue
						}
						n++
						t.Run(caseName(o.Case), func(t *testing.T) { r.check(t, o) })
					}
					if n == 0 {
						t.Errorf("the attacker reported nothing of %s", name)
					}
				})
			}
			t.Run("Neigh", func(t *testing.T) { r.neighAttacks(t, c, marker) })
			t.Run("Sniff", func(t *testing.T) { r.sniffAttack(t, c, marker) })
		})
	}
}

func title(s string) string {
	switch s {
	case attack.NewLink:
		return "NewLink"
	case attack.TUN:
		return "TUN"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// caseName keeps a case's name one level deep in the subtest tree.
func caseName(c string) string { return strings.ReplaceAll(c, "/", "_") }

// check fails the test if the outcome shows the attack worked, from the
// attacker's side (what it read back) or the victim's (what arrived).
func (r *wireRig) check(t *testing.T, o attack.Outcome) {
	t.Helper()
	t.Log(o)
	for _, s := range o.Reached {
		t.Errorf("%s: the attacker %s; want nothing", o.Case, s)
	}
	switch o.Attack {
	case attack.Egress, attack.Spoof, attack.NewLink:
		if o.Marker == "" {
			return
		}
		if how := r.arrivedAtVictim(o); len(how) > 0 {
			t.Errorf("%s %s -> %s: arrived (%s); want it dropped", o.Case, o.Src, o.Dst, strings.Join(how, "; "))
		}
	case attack.Node:
		if o.Marker == "" {
			return
		}
		if how, ok := r.nodeApp.Saw(o.Marker); ok {
			t.Errorf("%s %s -> %s: the node's application got it (%s); want it dropped", o.Case, o.Src, o.Dst, how)
		}
		if o.Dst.Port() == nodeTCP && r.atAttacker.Answered(uint8(header.TCPProtocolNumber), o.Src, o.Dst) {
			t.Errorf("%s %s -> %s: the node answered the SYN; want it dropped before the node's TCP", o.Case, o.Src, o.Dst)
		}
	}
}

// checkConfinement checks that the attacker ran as a container's process:
// root, exactly the capabilities asked for, the pod's network namespace,
// pid and mount namespaces of its own, none of the hidden paths visible.
func (r *wireRig) checkConfinement(t *testing.T, c confinement, o attack.Outcome) {
	t.Helper()
	got := o.Self
	if got == nil {
		t.Fatalf("no confinement report: %s", o)
	}
	want, err := attack.CapMask(c.caps...)
	if err != nil {
		t.Fatal(err)
	}
	if got.Effective != want || got.Permitted != want || got.Bounding != want || got.Inheritable != 0 || got.Ambient != 0 {
		t.Errorf("capabilities: got effective %v (permitted %#x, bounding %#x, inheritable %#x, ambient %#x), want exactly %v",
			got.Caps, got.Permitted, got.Bounding, got.Inheritable, got.Ambient, attack.CapList(want))
	}
	if sa, _ := attack.CapMask("sys_admin"); got.Effective&sa != 0 {
		t.Errorf("the attacker holds CAP_SYS_ADMIN")
	}
	if got.UID != 0 {
		t.Errorf("uid: got %d, want 0 (root in its container)", got.UID)
	}
	var st unix.Stat_t
	if err := unix.Stat(r.attacker.NS.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if podNet := fmt.Sprintf("net:[%d]", st.Ino); got.NetNS != podNet {
		t.Errorf("network namespace: got %s, want the pod's %s", got.NetNS, podNet)
	}
	for _, n := range []struct{ name, got string }{{"mnt", got.MntNS}, {"pid", got.PidNS}} {
		if ours, _ := os.Readlink("/proc/self/ns/" + n.name); n.got == ours {
			t.Errorf("%s namespace: got the test's own %s, want one of its own", n.name, ours)
		}
	}
	if got.PID != 1 {
		t.Errorf("pid: got %d, want 1 (the first process of its pid namespace)", got.PID)
	}
	if len(got.Visible) > 0 {
		t.Errorf("the attacker sees %v; want none of %v", got.Visible, r.hidden)
	}
}

// neighAttacks sends each ARP and NDP claim on its own and reads the
// node's neighbour table after each, so that a claim the node learns is
// told apart from the others.
func (r *wireRig) neighAttacks(t *testing.T, c confinement, marker string) {
	var macs []string
	for _, nc := range attack.NeighCases {
		spec := r.spec(marker, attack.Neigh)
		spec.NeighCase = nc
		outcomes := runAttack(t, r.attacker.NS, c, spec, nil)
		time.Sleep(100 * time.Millisecond)
		for _, o := range outcomes {
			t.Run(caseName(o.Case), func(t *testing.T) {
				t.Log(o)
				for _, s := range o.Reached {
					t.Errorf("%s: the attacker %s; want nothing", o.Case, s)
				}
				if !o.Claimed.IsValid() {
					return
				}
				for _, n := range r.neighbours(t, o.Claimed) {
					if n.HardwareAddr.String() == o.MAC {
						t.Errorf("%s: the node's neighbour table holds %s at %s (on link %d, state %s); want the claim ignored",
							o.Case, o.Claimed, n.HardwareAddr, n.LinkIndex, neighState(n.State))
					}
				}
			})
			if o.MAC != "" && !slices.Contains(macs, o.MAC) {
				macs = append(macs, o.MAC)
			}
		}
		for _, a := range []netip.Addr{r.victim.IP(4), r.victim.IP(6)} {
			r.forget(t, a, macs)
		}
	}
}

func neighState(s int) string {
	for _, n := range []struct {
		s    int
		name string
	}{{netlink.NUD_INCOMPLETE, "incomplete"}, {netlink.NUD_REACHABLE, "reachable"}, {netlink.NUD_STALE, "stale"},
		{netlink.NUD_DELAY, "delay"}, {netlink.NUD_PROBE, "probe"}, {netlink.NUD_FAILED, "failed"},
		{netlink.NUD_NOARP, "noarp"}, {netlink.NUD_PERMANENT, "permanent"}} {
		if s&n.s != 0 {
			return n.name
		}
	}
	return fmt.Sprintf("%#x", s)
}

// sniffTraffic is what is sent to the attacker while it sniffs: markers
// of traffic its ingress policy denies, and of the allowed peer's.
type sniffTraffic struct {
	allowed []string
	denied  map[string]string // marker -> how it was sent
	errs    []string
}

// sniffAttack has the attacker read every link while the victim (which
// the attacker's ingress policy denies) sends to it, and the node sends
// frames into its veth from the victim's addresses; the allowed peer's
// datagrams meanwhile show that the sniffer can see.
func (r *wireRig) sniffAttack(t *testing.T, c confinement, marker string) {
	spec := r.spec(marker, attack.Sniff)
	spec.SniffFor = attack.Duration(2500 * time.Millisecond)
	sent := make(chan sniffTraffic, 1)
	started := false
	outcomes := runAttack(t, r.attacker.NS, c, spec, func(o attack.Outcome) {
		if o.Case == "listening" && !started {
			started = true
			go func() { sent <- r.sendToAttacker(marker + "/sniffed") }()
		}
	})
	if !started {
		t.Fatalf("the sniffer never said it was listening: %v", outcomes)
	}
	tr := <-sent
	for _, e := range tr.errs {
		t.Errorf("sending to the attacker: %s", e)
	}
	seenBy := map[string][]string{} // marker -> "socket: link"
	for _, o := range outcomes {
		t.Log(o)
		for _, s := range o.Seen {
			m, where, _ := strings.Cut(s, "@")
			seenBy[m] = append(seenBy[m], fmt.Sprintf("socket %s read it on %s", o.Case, where))
		}
	}
	for _, m := range tr.allowed {
		t.Run("control_"+m[strings.LastIndexByte(m, '/')+1:], func(t *testing.T) {
			if _, ok := r.attackerApp.Saw(m); !ok {
				t.Errorf("%s: the allowed peer's datagram did not reach the attacker's application", m)
			}
			if len(seenBy[m]) == 0 {
				t.Errorf("%s: no packet socket read the allowed peer's datagram, which the pod's own kernel got: a sniffer that sees nothing proves nothing", m)
			}
		})
	}
	keys := make([]string, 0, len(tr.denied))
	for m := range tr.denied {
		keys = append(keys, m)
	}
	slices.Sort(keys)
	for _, m := range keys {
		t.Run(m[strings.LastIndexByte(m, '/')+1:], func(t *testing.T) {
			t.Logf("%s: %s", m, tr.denied[m])
			if len(seenBy[m]) > 0 {
				t.Errorf("traffic the pod's ingress policy denies (%s) was read in the pod: %s; want it never in the pod's namespace",
					tr.denied[m], strings.Join(seenBy[m], "; "))
			}
			if how, ok := r.attackerApp.Saw(m); ok {
				t.Errorf("traffic the pod's ingress policy denies (%s) reached its application (%s)", tr.denied[m], how)
			}
		})
	}
}

// sendToAttacker sends, over about a second, the allowed
// peer's datagrams, the victim's (denied) datagrams, and frames the node
// writes into the attacker's veth from the victim's addresses.
func (r *wireRig) sendToAttacker(marker string) sniffTraffic {
	tr := sniffTraffic{denied: map[string]string{}}
	fail := func(format string, a ...any) { tr.errs = append(tr.errs, fmt.Sprintf(format, a...)) }
	// The node's link-layer entry for the pod (the node always reaches its
	// pods): where its frames go.
	if c, err := nettest.Dial(r.env.Node, "udp", nettest.HostPort(r.attacker.IP(4), attackerUDP), time.Second); err == nil {
		c.Write([]byte("hello from the node"))
		c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	var podMAC net.HardwareAddr
	for _, n := range r.neighboursOf(r.attacker.IP(4)) {
		if n.LinkIndex == r.attackerVeth.Attrs().Index && len(n.HardwareAddr) == 6 {
			podMAC = n.HardwareAddr
		}
	}
	fd := -1
	if podMAC == nil {
		fail("the node has no link-layer address for %s", r.attacker.IP(4))
	} else if err := nettest.In(r.env.Node, func() (err error) { fd, err = openPacketSocket(r.attackerVeth.Attrs().Index); return err }); err != nil {
		fail("opening a packet socket on %s: %v", r.attackerVeth.Attrs().Name, err)
		fd = -1
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	for round := range 5 {
		for _, fam := range []int{4, 6} {
			to := netip.AddrPortFrom(r.attacker.IP(fam), attackerUDP)
			m := fmt.Sprintf("%s/peer-udp%d", marker, fam)
			if round == 0 {
				tr.allowed = append(tr.allowed, m)
			}
			sendUDP(r.peer, to, m, fail)
			m = fmt.Sprintf("%s/victim-udp%d", marker, fam)
			tr.denied[m] = fmt.Sprintf("UDP from the victim %s to %s", r.victim.IP(fam), to)
			sendUDP(r.victim, to, m, fail)
			if fd < 0 {
				continue
			}
			src := netip.AddrPortFrom(r.victim.IP(fam), uint16(41000+round))
			for _, p := range []struct {
				name string
				pkt  func(src, dst netip.AddrPort, payload []byte) []byte
				port uint16
			}{{"udp", attack.UDPPacket, attackerUDP}, {"syn", attack.SYNPacket, attackerTCP}} {
				m := fmt.Sprintf("%s/node-%s%d", marker, p.name, fam)
				dst := netip.AddrPortFrom(r.attacker.IP(fam), p.port)
				tr.denied[m] = fmt.Sprintf("%s from %s to %s, written by the node into %s", strings.ToUpper(p.name), src, dst, r.attackerVeth.Attrs().Name)
				ip := p.pkt(src, dst, []byte(m))
				frame := attack.Frame(podMAC, r.attackerVeth.Attrs().HardwareAddr, attack.EtherType(ip), ip)
				if _, err := unix.Write(fd, frame); err != nil {
					fail("writing a frame into %s: %v", r.attackerVeth.Attrs().Name, err)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return tr
}

func sendUDP(from *nettest.Pod, to netip.AddrPort, payload string, fail func(string, ...any)) {
	c, err := nettest.Dial(from.NS, "udp", to.String(), time.Second)
	if err != nil {
		fail("dialling %s from %s: %v", to, from.ID, err)
		return
	}
	defer c.Close()
	if _, err := c.Write([]byte(payload)); err != nil {
		fail("sending to %s from %s: %v", to, from.ID, err)
	}
}

// neighboursOf is neighbours without a test to fail.
func (r *wireRig) neighboursOf(a netip.Addr) []netlink.Neigh {
	var entries []netlink.Neigh
	nettest.In(r.env.Node, func() error {
		all, err := netlink.NeighList(r.attackerVeth.Attrs().Index, netlink.FAMILY_V4)
		for _, n := range all {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a {
				entries = append(entries, n)
			}
		}
		return err
	})
	return entries
}

// controls checks what the attacks' verdicts rest on: the victim's
// observers see what the allowed peer sends, and the policies are in
// force for the attacker's applications' ordinary sockets.
func (r *wireRig) controls(t *testing.T) {
	base := r.base + "-control"
	t.Run("PeerReachesVictim", func(t *testing.T) {
		var ms []string
		for _, fam := range []int{4, 6} {
			m := fmt.Sprintf("%s/peer-udp%d", base, fam)
			ms = append(ms, m)
			sendUDP(r.peer, netip.AddrPortFrom(r.victim.IP(fam), guardedUDP), m, t.Errorf)
			m = fmt.Sprintf("%s/peer-tcp%d", base, fam)
			ms = append(ms, m)
			// From a port below the attacks' (40000 and up), which
			// Watch.SYNTo tells them by.
			var c net.Conn
			err := nettest.In(r.peer.NS, func() (err error) {
				d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{Port: 39000 + fam}}
				c, err = d.Dial("tcp", nettest.HostPort(r.victim.IP(fam), guardedTCP))
				return err
			})
			if err != nil {
				t.Errorf("peer to victim over TCP: %v", err)
				continue
			}
			c.Write([]byte(m))
			c.Close()
		}
		deadline := time.Now().Add(5 * time.Second)
		for _, m := range ms {
			for {
				_, app := r.victimApp.Saw(m)
				if app && r.atVictim.Delivered(m) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s: victim's application got it %v, the node delivered it into %s %v; want both: the observers are blind",
						m, app, r.atVictim.Link, r.atVictim.Delivered(m))
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	t.Run("AttackerApplicationsDenied", func(t *testing.T) {
		// ms are checked where the victim's and the node's applications
		// get them and on the victim's link; atApp only where the
		// applications get them (the victim's own stack drops them).
		var ms, atApp []string
		var wg sync.WaitGroup
		for _, fam := range []int{4, 6} {
			m := fmt.Sprintf("%s/app-udp%d", base, fam)
			ms = append(ms, m)
			sendUDP(r.attacker, netip.AddrPortFrom(r.victim.IP(fam), victimUDP), m, t.Errorf)
			m = fmt.Sprintf("%s/app-node-udp%d", base, fam)
			ms = append(ms, m)
			sendUDP(r.attacker, netip.AddrPortFrom(r.attacker.Gateway(fam), nodeUDP), m, t.Errorf)
			// Egress allows this one; the victim's ingress policy does not.
			m = fmt.Sprintf("%s/app-guarded-udp%d", base, fam)
			atApp = append(atApp, m)
			sendUDP(r.attacker, netip.AddrPortFrom(r.victim.IP(fam), guardedUDP), m, t.Errorf)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c, err := nettest.Dial(r.attacker.NS, "tcp", nettest.HostPort(r.victim.IP(fam), victimTCP), time.Second); err == nil {
					c.Close()
					t.Errorf("the attacker's application connected to the victim's port %d over IPv%d: the egress policy is not in force", victimTCP, fam)
				}
			}()
		}
		wg.Wait()
		for _, m := range ms {
			if how := r.arrivedAtVictim(attack.Outcome{Marker: m}); len(how) > 0 {
				t.Errorf("%s: %s; want the attacker's egress policy to drop it", m, strings.Join(how, "; "))
			}
			if how, ok := r.nodeApp.Saw(m); ok {
				t.Errorf("%s: the node's application got it (%s); want the attacker's egress policy to drop it", m, how)
			}
		}
		for _, m := range atApp {
			if how, ok := r.victimApp.Saw(m); ok {
				t.Errorf("%s: the victim's application got it (%s); want the victim's ingress policy to drop it", m, how)
			}
		}
	})
}

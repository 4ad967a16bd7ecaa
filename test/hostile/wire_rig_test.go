package hostile

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/test/lib/attack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/cni-usernet/cni-usernet/test/lib/standin"
)

// The ports of the wire rig. The victim admits the attacker on victimUDP
// and victimTCP, which the attacker's egress policy denies, and only the
// peer on guardedUDP and guardedTCP, which the attacker's egress policy
// allows; the node serves nodeUDP and nodeTCP, which the attacker's egress
// policy denies; the attacker serves attackerUDP and attackerTCP, which
// only the peer may reach.
const (
	victimUDP   = 5001
	victimTCP   = 5002
	guardedUDP  = 5003
	guardedTCP  = 5004
	nodeUDP     = 5005
	nodeTCP     = 5006
	attackerUDP = 5007
	attackerTCP = 5008
)

// wireRig is a node namespace with three pods: an attacker and a victim
// on cni-usernet, both enforcing NetworkPolicy, and a peer on the kernel
// (ptp) that both policies admit. Recorders serve in the victim's,
// the node's and the attacker's namespaces, and Watches read the node's
// ends of the attacker's and the victim's veths.
type wireRig struct {
	env                    *nettest.Env
	attacker, victim, peer *nettest.Pod
	// base begins every marker of the test.
	base string
	// victimApp, nodeApp and attackerApp are the servers.
	victimApp, nodeApp, attackerApp *attack.Recorder
	// atVictim and atAttacker read the node's ends of the veths.
	atVictim, atAttacker *attack.Watch
	attackerVeth         netlink.Link
	// hidden are the paths no attacker may see.
	hidden []string
	n      uint64 // policy pushes, for increasing generations
}

func newWireRig(t *testing.T) *wireRig {
	t.Helper()
	env := nettest.NewEnv(t)
	suffix := make([]byte, 4)
	rand.Read(suffix)
	r := &wireRig{env: env, base: "cuatk-" + hex.EncodeToString(suffix)}
	standin.Agent(t, env)
	conf := env.Conf(cniVersion, map[string]any{"networkPolicy": true})
	r.attacker = env.NewPod(conf)
	r.victim = env.NewPod(conf)
	r.peer = env.NewPodWith("ptp", env.Conf(cniVersion, map[string]any{"type": "ptp", "stateDir": nil, "logDir": nil, "runDir": nil}))

	hostCIDR := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	peers := func(p *nettest.Pod) []policy.Peer {
		return []policy.Peer{{CIDR: hostCIDR(p.IP(4))}, {CIDR: hostCIDR(p.IP(6))}}
	}
	ports := func(udp, tcp uint16) []policy.PortRange {
		return []policy.PortRange{{Protocol: policy.UDP, First: udp}, {Protocol: policy.TCP, First: tcp}}
	}
	// Each attack meets one rule only: the attacker's egress policy stands
	// alone between it and the victim's victimUDP and victimTCP (which the
	// victim's ingress admits it to) and the node's ports, and the victim's
	// ingress policy alone between it and guardedUDP and guardedTCP (which
	// its egress policy lets it reach), so that a spoofed source is the one
	// way in there.
	r.push(t, r.attacker, &policy.PodPolicy{
		Ingress: policy.Direction{Isolated: true, Policies: []string{"wire/attacker"},
			Rules: []policy.Rule{{Policy: "wire/attacker", Peers: peers(r.peer)}}},
		Egress: policy.Direction{Isolated: true, Policies: []string{"wire/attacker"},
			Rules: []policy.Rule{
				{Policy: "wire/attacker", Peers: peers(r.peer)},
				{Policy: "wire/attacker", Peers: peers(r.victim), Ports: ports(guardedUDP, guardedTCP)},
			}},
	})
	r.push(t, r.victim, &policy.PodPolicy{Ingress: policy.Direction{Isolated: true, Policies: []string{"wire/victim"},
		Rules: []policy.Rule{
			{Policy: "wire/victim", Peers: peers(r.peer)},
			{Policy: "wire/victim", Peers: peers(r.attacker), Ports: ports(victimUDP, victimTCP)},
		}}})

	r.victimApp = r.serve(t, r.victim.NS, []int{victimUDP, guardedUDP}, []int{victimTCP, guardedTCP})
	r.nodeApp = r.serve(t, env.Node, []int{nodeUDP}, []int{nodeTCP})
	r.attackerApp = r.serve(t, r.attacker.NS, []int{attackerUDP}, []int{attackerTCP})
	r.atVictim, _ = r.watch(t, r.victim)
	r.atAttacker, r.attackerVeth = r.watch(t, r.attacker)

	// (env.Dir itself stays, empty: the attacker's tmpfs covers it.)
	r.hidden = []string{"/run/netns", "/var/run/netns", env.Node.Path(), r.attacker.NS.Path(), filepath.Join(env.Dir, "state")}
	for _, p := range []*nettest.Pod{r.attacker, r.victim} {
		att := r.state(t, p)
		r.hidden = append(r.hidden, att.ControlSocket, filepath.Dir(att.LogPath))
	}
	return r
}

func (r *wireRig) state(t *testing.T, p *nettest.Pod) *state.Attachment {
	t.Helper()
	att, err := (state.Store{Dir: filepath.Join(r.env.Dir, "state")}).Load(p.ID, "eth0")
	if err != nil {
		t.Fatalf("loading the state of %s: %v", p.ID, err)
	}
	return att
}

// push puts p in force in pod's stack as the agent does: the file first,
// then the control socket.
func (r *wireRig) push(t *testing.T, pod *nettest.Pod, p *policy.PodPolicy) {
	t.Helper()
	r.n++
	p.Version, p.Generation = policy.FormatVersion, 100+r.n
	p.Node = []netip.Addr{pod.Gateway(4), pod.Gateway(6)}
	path := attachment.PathsFor(filepath.Join(r.env.Dir, "state"), "", "", pod.ID, "eth0").Policy
	if err := policy.WriteFile(path, p); err != nil {
		t.Fatal(err)
	}
	g, err := control.PutPolicy(r.state(t, pod).ControlSocket, 5*time.Second, p)
	if err != nil || g != p.Generation {
		t.Fatalf("pushing generation %d to %s: got %d, %v", p.Generation, pod.ID, g, err)
	}
}

// serve starts a Recorder in netns on the ports (both families).
func (r *wireRig) serve(t *testing.T, netns ns.NetNS, udp, tcp []int) *attack.Recorder {
	t.Helper()
	rec := attack.NewRecorder(r.base)
	t.Cleanup(rec.Close)
	err := nettest.In(netns, func() error {
		for _, p := range udp {
			if err := rec.ListenUDP(fmt.Sprintf("[::]:%d", p)); err != nil {
				return err
			}
		}
		for _, p := range tcp {
			if err := rec.ListenTCP(fmt.Sprintf("[::]:%d", p)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// watch opens a Watch on the node's end of pod's veth.
func (r *wireRig) watch(t *testing.T, pod *nettest.Pod) (*attack.Watch, netlink.Link) {
	t.Helper()
	var w *attack.Watch
	var l netlink.Link
	err := nettest.In(r.env.Node, func() (err error) {
		if l, err = netlink.LinkByName(pod.HostVeth()); err != nil {
			return err
		}
		w, err = attack.NewWatch(l.Attrs().Name, l.Attrs().Index, r.base)
		return err
	})
	if err != nil {
		t.Fatalf("watching the node's end of %s's veth: %v", pod.ID, err)
	}
	t.Cleanup(w.Close)
	return w, l
}

// spec is what an attacker of the rig knows, for the attacks named.
func (r *wireRig) spec(marker string, attacks ...string) attack.Spec {
	pair := func(p *nettest.Pod) attack.Pair { return attack.Pair{V4: p.IP(4), V6: p.IP(6)} }
	return attack.Spec{
		Attacks:    attacks,
		Marker:     marker,
		Self:       pair(r.attacker),
		NodeAddr:   attack.Pair{V4: r.attacker.Gateway(4), V6: r.attacker.Gateway(6)},
		NodeUDP:    nodeUDP,
		NodeTCP:    nodeTCP,
		Victim:     pair(r.victim),
		VictimUDP:  victimUDP,
		VictimTCP:  victimTCP,
		Guarded:    pair(r.victim),
		GuardedUDP: guardedUDP,
		GuardedTCP: guardedTCP,
		Peer:       pair(r.peer),
		// Every namespace the attacker could reach is one of the test's.
		ForeignWrites: true,
		Hidden:        r.hidden,
	}
}

// arrivedAtVictim says how a packet reached the victim: its application
// got the marker, the node delivered the marker into the victim's link,
// or (a SYN, which a stack relaying it sends anew, without the marker)
// the node delivered a SYN to its destination from its source port.
func (r *wireRig) arrivedAtVictim(o attack.Outcome) []string {
	var how []string
	if s, ok := r.victimApp.Saw(o.Marker); ok {
		how = append(how, "the victim's application got it ("+s+")")
	}
	if r.atVictim.Delivered(o.Marker) {
		how = append(how, "the node delivered it into the victim's link "+r.atVictim.Link)
	} else if strings.Contains(o.Case, "syn") && o.Src.Port() != 0 {
		if from, ok := r.atVictim.SYNTo(o.Dst, o.Src.Port()); ok {
			how = append(how, fmt.Sprintf("the node delivered a SYN from %s into the victim's link %s", from, r.atVictim.Link))
		}
	}
	return how
}

// neighbours are the node's neighbour entries for a, as "lladdr on dev".
func (r *wireRig) neighbours(t *testing.T, a netip.Addr) (entries []netlink.Neigh) {
	t.Helper()
	err := nettest.In(r.env.Node, func() error {
		fam := netlink.FAMILY_V4
		if a.Is6() {
			fam = netlink.FAMILY_V6
		}
		all, err := netlink.NeighList(0, fam)
		if err != nil {
			return err
		}
		for _, n := range all {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a {
				entries = append(entries, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the node's neighbours: %v", err)
	}
	return entries
}

// forget removes the node's neighbour entries for a that hold one of the
// macs, so that the next claim starts from a clean table.
func (r *wireRig) forget(t *testing.T, a netip.Addr, macs []string) {
	t.Helper()
	for _, n := range r.neighbours(t, a) {
		if slices.Contains(macs, n.HardwareAddr.String()) || n.LinkIndex != r.victimVethIndex(t) {
			n := n
			nettest.In(r.env.Node, func() error { return netlink.NeighDel(&n) })
		}
	}
}

func (r *wireRig) victimVethIndex(t *testing.T) int {
	t.Helper()
	var idx int
	err := nettest.In(r.env.Node, func() error {
		l, err := netlink.LinkByName(r.victim.HostVeth())
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

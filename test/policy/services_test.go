package policy

import (
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// TestServiceEntriesAsCompiled: the two shapes of Service entry the agent
// compiles beside a cluster IP with its allowed backends. An entry
// without backends is denied even where an ipBlock allows its address
// (kube-proxy would translate it to a backend the rules deny), while the
// same address at another port is the plain address, allowed. A node port
// on the node's own address leads to the backend, as kube-proxy on this
// node would send it.
func TestServiceEntriesAsCompiled(t *testing.T) {
	r := newRig(t)
	const nodePort = 30080
	everywhere := policy.Rule{Policy: "test/out", Peers: []policy.Peer{
		{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}}}
	p := r.egressOnly(everywhere)
	p.Services = []policy.Service{
		{Name: "test/denied:http", Protocol: policy.TCP, VIP: netip.AddrPortFrom(r.other.IP(4), tcpPort)},
		{Name: "test/np:http", Protocol: policy.TCP, VIP: netip.AddrPortFrom(r.pod.Gateway(4), nodePort),
			Backends: []policy.Backend{{Addr: netip.AddrPortFrom(r.allowed.IP(4), tcpPort)}}},
	}
	r.push(t, p)
	wantTCP(t, "an entry without backends, in an allowed block", r.pod.NS, r.other.IP(4), tcpPort, false)
	wantTCP(t, "the same address at another port", r.pod.NS, r.other.IP(4), tcpPort2, true)
	wantTCP(t, "the node's address at the node port", r.pod.NS, r.pod.Gateway(4), nodePort, true)
	wantTCP(t, "the node's address at its own port", r.pod.NS, r.pod.Gateway(4), tcpPort, true)
}

package enforce_test

import (
	"net/netip"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func peer(cidr string, except ...string) policy.Peer {
	p := policy.Peer{CIDR: pfx(cidr)}
	for _, e := range except {
		p.Except = append(p.Except, pfx(e))
	}
	return p
}

func ports(proto policy.Protocol, first, last uint16) policy.PortRange {
	return policy.PortRange{Protocol: proto, First: first, Last: last}
}

// isolated is a direction isolated by ns/a and ns/b with rules.
func isolated(rules ...policy.Rule) policy.Direction {
	return policy.Direction{Isolated: true, Policies: []string{"ns/a", "ns/b"}, Rules: rules}
}

const (
	tcp   = policy.ProtoTCP
	udp   = policy.ProtoUDP
	sctp  = policy.ProtoSCTP
	icmp  = policy.ProtoICMP
	icmp6 = policy.ProtoICMPv6
)

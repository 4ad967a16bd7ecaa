package podstack

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
)

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func header4Any() tcpip.Subnet {
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	return sub
}

func header6Any() tcpip.Subnet {
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom16([16]byte{}), tcpip.MaskFromBytes(make([]byte, 16)))
	return sub
}

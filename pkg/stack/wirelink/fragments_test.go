package wirelink

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestIsIPv6Fragment(t *testing.T) {
	fixed := func(next uint8, ext ...byte) []byte {
		b := make([]byte, header.IPv6MinimumSize, header.IPv6MinimumSize+len(ext))
		header.IPv6(b).Encode(&header.IPv6Fields{TransportProtocol: tcpip.TransportProtocolNumber(next), HopLimit: 64})
		return append(b, ext...)
	}
	opts := func(next uint8) []byte { return []byte{next, 0, 1, 4, 0, 0, 0, 0} } // 8 bytes: a PadN
	for _, c := range []struct {
		name string
		h    []byte
		want bool
	}{
		{"UDP", fixed(17), false},
		{"fragment header first", fixed(44, 17, 0, 0, 1, 0, 0, 0, 7), true},
		{"behind hop-by-hop and destination options", fixed(0, append(opts(60), opts(44)...)...), true},
		{"hop-by-hop then TCP", fixed(0, opts(6)...), false},
		{"truncated extension header", fixed(0, 44), false},
		{"shorter than the fixed header", make([]byte, 20), false},
	} {
		if got := isIPv6Fragment(c.h); got != c.want {
			t.Errorf("%s: isIPv6Fragment = %v, want %v", c.name, got, c.want)
		}
	}
}

package relay

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// request turns a reply built by buildEchoReply back into a request, so
// that the parser can be tested on packets with valid checksums and
// lengths in both families.
func request(src, dst netip.Addr, id, seq uint16, data []byte) []byte {
	p := buildEchoReply(echo{src: dst, dst: src, id: id, seq: seq}, data)
	if src.Is4() {
		p[20] = icmpv4EchoRequest
	} else {
		p[40] = icmpv6EchoRequest
	}
	return p
}

func TestEchoRoundTrip(t *testing.T) {
	for _, c := range []struct{ src, dst string }{{"10.0.0.2", "10.0.0.1"}, {"fd99::2", "fd99::1"}} {
		src, dst := netip.MustParseAddr(c.src), netip.MustParseAddr(c.dst)
		data := []byte("abcdefghijklmnopqrstuvwxyz012345")
		e, ok := parseEchoRequest(request(src, dst, 77, 3, data))
		if !ok {
			t.Fatalf("%s: request not recognised", c.src)
		}
		if e.src != src || e.dst != dst || e.id != 77 || e.seq != 3 || !bytes.Equal(e.data, data) {
			t.Fatalf("%s: parsed %+v", c.src, e)
		}
		reply := buildEchoReply(e, data)
		if src.Is4() {
			if checksum.Checksum(reply[:20], 0) != 0xffff || checksum.Checksum(reply[20:], 0) != 0xffff {
				t.Errorf("IPv4 reply checksums invalid")
			}
			if reply[20] != icmpv4EchoReply || netip.AddrFrom4([4]byte(reply[16:20])) != src {
				t.Errorf("IPv4 reply type %d to %v", reply[20], reply[16:20])
			}
		} else {
			var pseudo []byte
			pseudo = append(pseudo, reply[8:40]...)
			pseudo = append(pseudo, 0, 0, byte(len(reply[40:])>>8), byte(len(reply[40:])), 0, 0, 0, protoICMPv6)
			if checksum.Checksum(reply[40:], checksum.Checksum(pseudo, 0)) != 0xffff {
				t.Errorf("ICMPv6 reply checksum invalid")
			}
			if reply[40] != icmpv6EchoReply {
				t.Errorf("IPv6 reply type %d", reply[40])
			}
		}
	}
}

func TestParseEchoRejects(t *testing.T) {
	v4 := request(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), 1, 1, []byte("x"))
	frag := bytes.Clone(v4)
	frag[6] = 0x20 // more fragments
	reply := bytes.Clone(v4)
	reply[20] = icmpv4EchoReply
	udp := bytes.Clone(v4)
	udp[9] = 17
	for name, p := range map[string][]byte{
		"empty": nil, "short": v4[:10], "truncated": v4[:len(v4)-1], "fragment": frag,
		"reply": reply, "udp": udp, "version 5": append([]byte{0x50}, v4[1:]...),
	} {
		if _, ok := parseEchoRequest(p); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseEchoRequest(f *testing.F) {
	f.Add(request(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), 1, 1, []byte("ping")))
	f.Add(request(netip.MustParseAddr("fd99::2"), netip.MustParseAddr("fd99::1"), 9, 2, nil))
	f.Fuzz(func(t *testing.T, p []byte) {
		e, ok := parseEchoRequest(p)
		if !ok {
			return
		}
		if len(e.data) > len(p) {
			t.Fatalf("data longer than the packet")
		}
		if looks := looksLikeEcho(p); !looks {
			t.Fatalf("parser accepts what the fast check rejects")
		}
		_ = buildEchoReply(e, e.data)
	})
}

func TestBuildRST(t *testing.T) {
	for _, c := range []struct{ app, remote string }{{"10.0.0.2:40000", "10.9.9.9:80"}, {"[fd99::2]:40000", "[fd99::9]:80"}} {
		app, remote := netip.MustParseAddrPort(c.app), netip.MustParseAddrPort(c.remote)
		rst := buildRST(buildSYNFor(app, remote))
		k, ok := parseSYN(buildSYNFor(app, remote))
		if !ok || k.app != app || k.remote != remote {
			t.Fatalf("%s: parseSYN got %+v %v, want app %s remote %s", c.app, k, ok, app, remote)
		}
		ipLen, src, dst, ok := tcpHeaderAt(rst)
		if !ok || src != remote.Addr() || dst != app.Addr() {
			t.Fatalf("%s: RST from %s to %s, want from %s to %s", c.app, src, dst, remote.Addr(), app.Addr())
		}
		tcp := rst[ipLen:]
		if tcp[13] != tcpFlagRST|tcpFlagACK {
			t.Errorf("%s: flags %#x, want RST|ACK", c.app, tcp[13])
		}
		if got := binary.BigEndian.Uint32(tcp[8:12]); got != 1001 {
			t.Errorf("%s: ack %d, want the SYN's sequence number + 1 (1001)", c.app, got)
		}
		// A correct checksum sums, with the pseudo-header, to all ones.
		n := 4
		if src.Is6() {
			n = 16
		}
		sum := checksum.Checksum(rst[ipLen-2*n:ipLen], 0)
		sum = checksum.Combine(sum, protoTCP)
		sum = checksum.Combine(sum, uint16(len(tcp)))
		if got := checksum.Checksum(tcp, sum); got != 0xffff {
			t.Errorf("%s: TCP checksum does not verify (sum %#x)", c.app, got)
		}
		if src.Is4() && checksum.Checksum(rst[:20], 0) != 0xffff {
			t.Errorf("%s: IPv4 header checksum does not verify", c.app)
		}
	}
}

// buildSYNFor makes a SYN from app to remote with sequence number 1000,
// by turning a RST built for the reverse direction around.
func buildSYNFor(app, remote netip.AddrPort) []byte {
	probe := buildRST(rawSYN(remote, app))
	ipLen, _, _, _ := tcpHeaderAt(probe)
	probe[ipLen+13] = tcpFlagSYN
	binary.BigEndian.PutUint32(probe[ipLen+4:ipLen+8], 1000)
	return probe
}

// rawSYN is the smallest packet tcpHeaderAt and buildRST accept, from src
// to dst.
func rawSYN(src, dst netip.AddrPort) []byte {
	var p []byte
	if src.Addr().Is4() {
		p = make([]byte, 40)
		p[0], p[9] = 0x45, protoTCP
		copy(p[12:16], src.Addr().AsSlice())
		copy(p[16:20], dst.Addr().AsSlice())
	} else {
		p = make([]byte, 60)
		p[0], p[6] = 0x60, protoTCP
		copy(p[8:24], src.Addr().AsSlice())
		copy(p[24:40], dst.Addr().AsSlice())
	}
	t := p[len(p)-20:]
	binary.BigEndian.PutUint16(t[0:2], src.Port())
	binary.BigEndian.PutUint16(t[2:4], dst.Port())
	t[13] = tcpFlagSYN
	return p
}

func TestBuildUDP(t *testing.T) {
	for _, c := range []struct{ src, dst string }{{"10.0.0.9:53", "10.0.0.2:40000"}, {"[fd99::9]:53", "[fd99::2]:40000"}} {
		src, dst := netip.MustParseAddrPort(c.src), netip.MustParseAddrPort(c.dst)
		payload := []byte("an answer")
		p := buildUDP(src, dst, payload)
		ipLen, n := 20, 4
		if src.Addr().Is6() {
			ipLen, n = 40, 16
		}
		u := p[ipLen:]
		if got := binary.BigEndian.Uint16(u[0:2]); got != src.Port() {
			t.Errorf("%s: source port %d, want %d", c.src, got, src.Port())
		}
		if got := binary.BigEndian.Uint16(u[2:4]); got != dst.Port() {
			t.Errorf("%s: destination port %d, want %d", c.src, got, dst.Port())
		}
		if !bytes.Equal(u[8:], payload) {
			t.Errorf("%s: payload %q, want %q", c.src, u[8:], payload)
		}
		sum := checksum.Checksum(p[ipLen-2*n:ipLen], 0)
		sum = checksum.Combine(sum, protoUDP)
		sum = checksum.Combine(sum, uint16(len(u)))
		if got := checksum.Checksum(u, sum); got != 0xffff {
			t.Errorf("%s: UDP checksum does not verify (sum %#x)", c.src, got)
		}
		if src.Addr().Is4() && checksum.Checksum(p[:20], 0) != 0xffff {
			t.Errorf("%s: IPv4 header checksum does not verify", c.src)
		}
	}
	if p := buildUDP(netip.MustParseAddrPort("10.0.0.9:53"), netip.MustParseAddrPort("10.0.0.2:1"), make([]byte, 65535)); p != nil {
		t.Errorf("oversized datagram: got a %d-byte packet, want none", len(p))
	}
}

package sourceguard

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 5}
	ips := []netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5")}
	for _, tc := range []struct {
		name string
		g    Guard
		want string // part of the error, "" for none
	}{
		{"valid", Guard{Link: "usn1234abcd5678", MAC: mac, IPs: ips}, ""},
		{"IPv4 only", Guard{Link: "veth0", MAC: mac, IPs: ips[:1]}, ""},
		{"IPv6 only", Guard{Link: "veth0", MAC: mac, IPs: ips[1:]}, ""},
		{"link-local IPv6", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.MustParseAddr("fe80::1%veth0")}}, ""},
		{"no link", Guard{MAC: mac, IPs: ips}, "invalid link name"},
		{"link name too long", Guard{Link: "usn1234abcd56789", MAC: mac, IPs: ips}, "invalid link name"},
		{"no MAC", Guard{Link: "veth0", IPs: ips}, "want 6 bytes"},
		{"InfiniBand MAC", Guard{Link: "veth0", MAC: make(net.HardwareAddr, 20), IPs: ips}, "want 6 bytes"},
		{"multicast MAC", Guard{Link: "veth0", MAC: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, IPs: ips}, "multicast"},
		{"zero MAC", Guard{Link: "veth0", MAC: make(net.HardwareAddr, 6), IPs: ips}, "all zeros"},
		{"no addresses", Guard{Link: "veth0", MAC: mac}, "no pod addresses"},
		{"invalid address", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{{}}}, "invalid pod address"},
		{"0.0.0.0", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.IPv4Unspecified()}}, "cannot be a source"},
		{"::", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.IPv6Unspecified()}}, "cannot be a source"},
		{"::ffff:0.0.0.0", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.MustParseAddr("::ffff:0.0.0.0")}}, "cannot be a source"},
		{"multicast address", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.MustParseAddr("ff02::1")}}, "cannot be a source"},
		{"broadcast", Guard{Link: "veth0", MAC: mac, IPs: []netip.Addr{netip.MustParseAddr("255.255.255.255")}}, "cannot be a source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestSplit: mapped IPv4 counts as IPv4, zones are dropped and each
// address appears once, so the sets hold what the rules compare with.
func TestSplit(t *testing.T) {
	g := Guard{IPs: []netip.Addr{
		netip.MustParseAddr("10.1.0.5"),
		netip.MustParseAddr("::ffff:10.1.0.5"),
		netip.MustParseAddr("fd00::5"),
		netip.MustParseAddr("fe80::1%eth0"),
		netip.MustParseAddr("fe80::1"),
	}}
	v4, v6 := g.split()
	if want := [][]byte{{10, 1, 0, 5}}; !slices.EqualFunc(v4, want, slices.Equal) {
		t.Errorf("IPv4: got %v, want %v", v4, want)
	}
	want6 := [][]byte{netip.MustParseAddr("fd00::5").AsSlice(), netip.MustParseAddr("fe80::1").AsSlice()}
	if !slices.EqualFunc(v6, want6, slices.Equal) {
		t.Errorf("IPv6: got %v, want %v", v6, want6)
	}
}

func TestTableName(t *testing.T) {
	if got, want := TableName("usn1234abcd5678"), "cni-usernet-guard-usn1234abcd5678"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

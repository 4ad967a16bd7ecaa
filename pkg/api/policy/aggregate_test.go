package policy

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

func TestAggregate(t *testing.T) {
	p := netip.MustParsePrefix
	host := func(s string) Peer {
		return Peer{CIDR: netip.PrefixFrom(netip.MustParseAddr(s), netip.MustParseAddr(s).BitLen())}
	}
	for _, c := range []struct {
		name string
		in   []Peer
		want []Peer
	}{
		{"a run of hosts", []Peer{host("10.0.0.3"), host("10.0.0.1"), host("10.0.0.2"), host("10.0.0.4")},
			[]Peer{{CIDR: p("10.0.0.1/32")}, {CIDR: p("10.0.0.2/31")}, {CIDR: p("10.0.0.4/32")}}},
		{"a whole /24 of hosts and a duplicate", append(hosts("10.1.2.", 0, 256), host("10.1.2.7")), []Peer{{CIDR: p("10.1.2.0/24")}}},
		{"hosts inside a block", []Peer{host("10.0.0.9"), {CIDR: p("10.0.0.0/8")}, host("192.0.2.1")},
			[]Peer{{CIDR: p("10.0.0.0/8")}, {CIDR: p("192.0.2.1/32")}}},
		{"a block with an except stays, a host in the except too", []Peer{{CIDR: p("10.0.0.0/8"), Except: []netip.Prefix{p("10.1.0.0/16")}}, host("10.1.0.5")},
			[]Peer{{CIDR: p("10.0.0.0/8"), Except: []netip.Prefix{p("10.1.0.0/16")}}, {CIDR: p("10.1.0.5/32")}}},
		{"IPv6 beside IPv4", []Peer{host("fd00::1"), host("fd00::0"), host("10.0.0.0")},
			[]Peer{{CIDR: p("10.0.0.0/32")}, {CIDR: p("fd00::/127")}}},
		{"everything", []Peer{{CIDR: p("0.0.0.0/1")}, {CIDR: p("128.0.0.0/1")}}, []Peer{{CIDR: p("0.0.0.0/0")}}},
		{"none", nil, nil},
	} {
		if got := Aggregate(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func hosts(prefix string, from, to int) []Peer {
	var out []Peer
	for i := from; i < to; i++ {
		a := netip.MustParseAddr(prefix + itoa(i))
		out = append(out, Peer{CIDR: netip.PrefixFrom(a, 32)})
	}
	return out
}

func itoa(i int) string { return netip.AddrFrom4([4]byte{0, 0, 0, byte(i)}).String()[6:] }

// Aggregated peers admit exactly the addresses the peers did, in no more
// prefixes, and aggregating again changes nothing.
func TestAggregateKeepsTheSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		var in []Peer
		for range rng.IntN(40) {
			var a netip.Addr
			if rng.IntN(4) == 0 {
				a = netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(64))})
			} else {
				a = netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(2)), byte(rng.IntN(64))})
			}
			bitsMin := a.BitLen() - 6
			pr, _ := a.Prefix(bitsMin + rng.IntN(7))
			peer := Peer{CIDR: pr}
			if rng.IntN(8) == 0 && pr.Bits() < a.BitLen() {
				ex, _ := a.Prefix(pr.Bits() + 1)
				peer.Except = []netip.Prefix{ex}
			}
			in = append(in, peer)
		}
		out := Aggregate(in)
		var before, after addrSetBuilder
		before.addPeers(in)
		after.addPeers(out)
		if len(in) == 0 {
			if len(out) != 0 {
				t.Fatalf("no peers aggregated into %v", out)
			}
			continue
		}
		b, a := before.build(), after.build()
		if !slices.Equal(b.v4, a.v4) || !slices.Equal(b.v6, a.v6) {
			t.Fatalf("Aggregate(%v) = %v: another set of addresses", in, out)
		}
		if len(out) > len(in) {
			t.Fatalf("Aggregate(%v) = %v: more prefixes than it was given", in, out)
		}
		if again := Aggregate(out); !reflect.DeepEqual(again, out) {
			t.Fatalf("Aggregate is not idempotent: %v, then %v", out, again)
		}
	}
}

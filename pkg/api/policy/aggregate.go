package policy

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
)

// Aggregate is peers as few prefixes as hold the same addresses: the
// peers without excepts merged into the shortest prefixes that cover
// exactly their union (pods' host addresses next to each other become one
// prefix), the peers with excepts kept as they are. It is sorted and
// holds no duplicate, so that equal sets of peers give equal lists.
//
// A rule that admits the pods of many namespaces admits thousands of host
// addresses, mostly in runs (each node's pods are numbered from its own
// pod CIDR): as runs they are a fraction of the bytes to push, write and
// compare, and the stack makes spans of them either way.
func Aggregate(peers []Peer) []Peer {
	var v4, v6 []span
	var out []Peer
	for _, p := range peers {
		switch {
		case len(p.Except) > 0:
			out = append(out, p)
		case p.CIDR.Addr().Is4():
			v4 = append(v4, spanOf(p.CIDR))
		default:
			v6 = append(v6, spanOf(p.CIDR))
		}
	}
	for _, sp := range normalize(v4) {
		out = appendPrefixes(out, sp, true)
	}
	for _, sp := range normalize(v6) {
		out = appendPrefixes(out, sp, false)
	}
	slices.SortFunc(out, comparePeers)
	return slices.CompactFunc(out, func(a, b Peer) bool { return a.CIDR == b.CIDR && slices.Equal(a.Except, b.Except) })
}

func comparePeers(a, b Peer) int {
	return cmp.Or(comparePrefix(a.CIDR, b.CIDR), slices.CompareFunc(a.Except, b.Except, comparePrefix))
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// appendPrefixes appends the fewest prefixes that cover sp exactly: from
// its first address on, each time the largest block aligned there that
// does not run past its end.
func appendPrefixes(out []Peer, sp span, v4 bool) []Peer {
	width := 128
	if v4 {
		width = 32
	}
	cur := sp.first
	for {
		host := min(trailingZeros(cur), width)
		for host > 0 && cur.or(lowBits(host)).cmp(sp.last) > 0 {
			host--
		}
		out = append(out, Peer{CIDR: netip.PrefixFrom(fromU128(cur, v4), width-host)})
		end := cur.or(lowBits(host))
		if end.cmp(sp.last) >= 0 {
			return out
		}
		cur = end.inc()
	}
}

func trailingZeros(a u128) int {
	switch {
	case a.lo != 0:
		return bits.TrailingZeros64(a.lo)
	case a.hi != 0:
		return 64 + bits.TrailingZeros64(a.hi)
	}
	return 128
}

// lowBits is the number with the n lowest bits set.
func lowBits(n int) u128 {
	switch {
	case n <= 0:
		return u128{}
	case n < 64:
		return u128{lo: 1<<n - 1}
	case n == 64:
		return u128{lo: ^uint64(0)}
	case n < 128:
		return u128{hi: 1<<(n-64) - 1, lo: ^uint64(0)}
	}
	return u128{^uint64(0), ^uint64(0)}
}

func (a u128) or(b u128) u128 { return u128{a.hi | b.hi, a.lo | b.lo} }

func fromU128(a u128, v4 bool) netip.Addr {
	if v4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(a.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], a.hi)
	binary.BigEndian.PutUint64(b[8:], a.lo)
	return netip.AddrFrom16(b)
}

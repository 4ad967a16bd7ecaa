package policy

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// u128 is an address as a number: IPv4 in lo alone.
type u128 struct{ hi, lo uint64 }

func (a u128) cmp(b u128) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func (a u128) inc() u128 {
	if a.lo == ^uint64(0) {
		return u128{a.hi + 1, 0}
	}
	return u128{a.hi, a.lo + 1}
}

func (a u128) dec() u128 {
	if a.lo == 0 {
		return u128{a.hi - 1, ^uint64(0)}
	}
	return u128{a.hi, a.lo - 1}
}

func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// span is the addresses first..last, inclusive.
type span struct{ first, last u128 }

// spanOf is the addresses of p.
func spanOf(p netip.Prefix) span {
	p = p.Masked()
	first := toU128(p.Addr())
	host := p.Addr().BitLen() - p.Bits() // bits of the host part
	return span{first, first.or(lowBits(host))}
}

// addrSet is a set of addresses as sorted, disjoint, non-adjacent spans
// per family: one binary search per lookup, however many peers and
// excepts it was made of.
type addrSet struct {
	all    bool // every address (a rule without peers)
	v4, v6 []span
}

func (s *addrSet) contains(a netip.Addr) bool {
	if s.all {
		return true
	}
	spans := s.v6
	if a.Is4() {
		spans = s.v4
	}
	x := toU128(a)
	// The first span that ends at or after x is the only one that can
	// hold it.
	i, _ := slices.BinarySearchFunc(spans, x, func(sp span, x u128) int { return sp.last.cmp(x) })
	return i < len(spans) && spans[i].first.cmp(x) <= 0
}

func (s *addrSet) empty() bool { return !s.all && len(s.v4) == 0 && len(s.v6) == 0 }

// addrSetBuilder collects peers into an addrSet.
type addrSetBuilder struct {
	all    bool
	v4, v6 []span
}

// addPeers adds a rule's peers; none is every address.
func (b *addrSetBuilder) addPeers(peers []Peer) {
	if len(peers) == 0 {
		b.all = true
		return
	}
	for _, p := range peers {
		var except []span
		for _, e := range p.Except {
			except = append(except, spanOf(e))
		}
		pieces := subtract(spanOf(p.CIDR), normalize(except))
		if p.CIDR.Addr().Is4() {
			b.v4 = append(b.v4, pieces...)
		} else {
			b.v6 = append(b.v6, pieces...)
		}
	}
}

func (b *addrSetBuilder) build() *addrSet {
	if b.all {
		return &addrSet{all: true}
	}
	return &addrSet{v4: normalize(b.v4), v6: normalize(b.v6)}
}

// normalize sorts spans and merges those that overlap or touch.
func normalize(spans []span) []span {
	if len(spans) == 0 {
		return nil
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.cmp(b.first) })
	out := spans[:1]
	for _, sp := range spans[1:] {
		last := &out[len(out)-1]
		if last.last.cmp(sp.first) >= 0 || last.last.inc() == sp.first {
			if sp.last.cmp(last.last) > 0 {
				last.last = sp.last
			}
			continue
		}
		out = append(out, sp)
	}
	return slices.Clip(out)
}

// subtract is whole less the normalized spans of holes.
func subtract(whole span, holes []span) []span {
	var out []span
	cur := whole.first
	done := false
	for _, h := range holes {
		if h.last.cmp(cur) < 0 {
			continue
		}
		if h.first.cmp(whole.last) > 0 {
			break
		}
		if h.first.cmp(cur) > 0 {
			out = append(out, span{cur, h.first.dec()})
		}
		if h.last.cmp(whole.last) >= 0 {
			done = true
			break
		}
		cur = h.last.inc()
	}
	if !done {
		out = append(out, span{cur, whole.last})
	}
	return out
}

package sourceguard

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/node/nfttable"
)

// Names inside each table; doc.go shows them in place.
const (
	counterName      = "dropped"
	setPod4          = "pod4"
	setPod6          = "pod6"
	chainIngress     = "ingress"
	chainIPv4        = "ipv4"
	chainARP         = "arp"
	chainIPv6        = "ipv6"
	chainUnspecified = "ipv6-unspecified"
	chainICMPv6      = "ipv6-icmp"
	chainNS          = "ipv6-ns"
	chainNA          = "ipv6-na"
)

// priority runs the base chain before other tables' netdev ingress chains
// at the standard priorities (raw is -300, filter 0), so that none of them
// forwards or duplicates a frame this one would drop.
const priority = -500

// Offsets the rules read, in bytes from the start of the Ethernet header
// (eth*) or of the network header (the rest). The network header of an
// ICMPv6 message sent without extension headers is the 40-byte fixed IPv6
// header, so its ICMPv6 fields sit 40 bytes further than RFC 4443 and RFC
// 4861 place them.
const (
	ethSrc  = 6
	ethType = 12

	ip4Src = 12

	arpHType = 0 // RFC 826: hardware type, protocol type, their lengths,
	arpPType = 2 // operation, then the sender's hardware and protocol
	arpHLen  = 4 // addresses
	arpPLen  = 5
	arpOp    = 6
	arpSHA   = 8
	arpSPA   = 14

	ip6PayloadLen = 4
	ip6NextHdr    = 6
	ip6Src        = 8
	icmp6Type     = 40
	ndTarget      = icmp6Type + 8  // after type, code, checksum, flags
	ndOption      = icmp6Type + 24 // the first option's type and length
	ndOptionAddr  = ndOption + 2   // its link-layer address
)

// Protocol numbers and lengths the rules compare with.
var (
	etherIPv4 = be16(unix.ETH_P_IP)
	etherARP  = be16(unix.ETH_P_ARP)
	etherIPv6 = be16(unix.ETH_P_IPV6)

	// ndPlain and ndWithAddr are the ICMPv6 lengths of a neighbour
	// solicitation or advertisement without options and with one
	// link-layer address option (8 bytes for Ethernet).
	ndPlain    = be16(24)
	ndWithAddr = be16(32)
	// Option types: source (in solicitations) and target (in
	// advertisements) link-layer address, each one 8-byte unit long.
	optSourceAddr = []byte{1, 1}
	optTargetAddr = []byte{2, 1}

	ipv6Unspecified = make([]byte, 16)
	// linkLocalMask and linkLocal are fe80::/10 on an address's first two
	// bytes, all of it the rules need to load.
	linkLocalMask = []byte{0xff, 0xc0}
	linkLocal     = []byte{0xfe, 0x80}
)

// ICMPv6 types the rules treat apart (RFC 4861).
const (
	icmp6RouterAdvert   = 134
	icmp6NeighborSolic  = 135
	icmp6NeighborAdvert = 136
	icmp6Redirect       = 137
)

// Install makes the kernel drop, in the calling thread's network
// namespace, every frame that g.Link receives and the pod was not entitled
// to send (see the package documentation). It is idempotent: it replaces
// the link's table in one transaction, carrying the drop counter over, so
// after any number of calls exactly one guard, the last one, is in force.
// Frames dropped between the counter's read and the replacement are not
// carried over.
func Install(g Guard) error {
	if err := install(g); err != nil {
		return fmt.Errorf("installing the source guard on %s: %w", g.Link, err)
	}
	return nil
}

func install(g Guard) error {
	if err := g.Validate(); err != nil {
		return err
	}
	// Newer kernels (6.16 and later; this project's 6.18 VMs do) accept a
	// netdev hook on a link that does not exist yet and attach it when one
	// of that name appears; older ones refuse it. Checking first gives one answer on every kernel, and the
	// right one: a guard on a misspelt link protects nothing.
	if _, err := netlinksafe.LinkByName(g.Link); err != nil {
		return fmt.Errorf("looking up the link: %w", err)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer c.CloseLasting()
	t := table(g.Link)
	old, _, err := readCounter(c, t)
	if err != nil {
		return err
	}
	if err := nfttable.Replace(c, t); err != nil {
		return err
	}
	if err := build(c, t, g, old); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("committing table %s: %w", t.Name, err)
	}
	return nil
}

// Remove deletes the guard Install put on link, in the calling thread's
// network namespace. A guard, or a link, that is already gone is success.
func Remove(link string) error {
	if err := validName(link); err != nil {
		return fmt.Errorf("removing the source guard from %s: %w", link, err)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("removing the source guard from %s: opening netlink: %w", link, err)
	}
	defer c.CloseLasting()
	t := table(link)
	c.AddTable(t) // makes the delete valid when the table is gone
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing the source guard from %s: deleting table %s: %w", link, t.Name, err)
	}
	return nil
}

// Dropped returns how many frames the guard on link has dropped since the
// first Install, in the calling thread's network namespace. For a link
// without a guard it returns 0 and an error wrapping ErrNotInstalled.
func Dropped(link string) (uint64, error) {
	if err := validName(link); err != nil {
		return 0, fmt.Errorf("reading the source guard's drops on %s: %w", link, err)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return 0, fmt.Errorf("reading the source guard's drops on %s: opening netlink: %w", link, err)
	}
	defer c.CloseLasting()
	n, ok, err := readCounter(c, table(link))
	if err != nil {
		return 0, fmt.Errorf("reading the source guard's drops on %s: %w", link, err)
	}
	if !ok {
		return 0, fmt.Errorf("reading the source guard's drops on %s: %w", link, ErrNotInstalled)
	}
	return n.Packets, nil
}

func table(link string) *nftables.Table {
	return &nftables.Table{Name: TableName(link), Family: nftables.TableFamilyNetdev}
}

// readCounter returns the drop counter of t and whether t has one. It
// dumps t's objects rather than asking for the one counter: a dump of a
// table that does not exist is empty, where the direct request fails with
// an error the library formats with %v, so ENOENT could not be told from a
// real failure.
func readCounter(c *nftables.Conn, t *nftables.Table) (nftables.CounterObj, bool, error) {
	objs, err := c.GetObjects(t)
	if err != nil {
		return nftables.CounterObj{}, false, fmt.Errorf("listing the objects of table %s: %w", t.Name, err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && co.Name == counterName {
			return *co, true, nil
		}
	}
	return nftables.CounterObj{}, false, nil
}

// build queues on c everything the table holds, the counter starting from
// old.
func build(c *nftables.Conn, t *nftables.Table, g Guard, old nftables.CounterObj) error {
	v4, v6 := g.split()
	b := &builder{c: c, t: t, mac: g.MAC}
	c.AddObj(&nftables.CounterObj{Table: t, Name: counterName, Packets: old.Packets, Bytes: old.Bytes})

	policy := nftables.ChainPolicyDrop
	ingress := c.AddChain(&nftables.Chain{
		Name:     chainIngress,
		Table:    t,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookIngress,
		Priority: nftables.ChainPriorityRef(priority),
		Device:   g.Link,
		Policy:   &policy,
	})
	b.rule(ingress, load(expr.PayloadBaseLLHeader, ethSrc, 6), neq(g.MAC), countDrop())
	if len(v4) > 0 {
		pod4, err := b.set(setPod4, nftables.TypeIPAddr, v4)
		if err != nil {
			return err
		}
		b.ipv4(pod4)
		b.arp(pod4)
		b.rule(ingress, is(expr.PayloadBaseLLHeader, ethType, etherIPv4), goTo(chainIPv4))
		b.rule(ingress, is(expr.PayloadBaseLLHeader, ethType, etherARP), goTo(chainARP))
	}
	if len(v6) > 0 {
		pod6, err := b.set(setPod6, nftables.TypeIP6Addr, v6)
		if err != nil {
			return err
		}
		b.ipv6(pod6)
		b.rule(ingress, is(expr.PayloadBaseLLHeader, ethType, etherIPv6), goTo(chainIPv6))
	}
	b.rule(ingress, countDrop())
	return nil
}

// builder queues the rules of one table.
type builder struct {
	c   *nftables.Conn
	t   *nftables.Table
	mac []byte
}

func (b *builder) set(name string, key nftables.SetDatatype, elems [][]byte) (*nftables.Set, error) {
	s := &nftables.Set{Table: b.t, Name: name, KeyType: key}
	vals := make([]nftables.SetElement, len(elems))
	for i, e := range elems {
		vals[i] = nftables.SetElement{Key: e}
	}
	if err := b.c.AddSet(s, vals); err != nil {
		return nil, fmt.Errorf("adding set %s: %w", name, err)
	}
	return s, nil
}

// chain adds a regular chain, one that only a jump or goto enters.
func (b *builder) chain(name string) *nftables.Chain {
	return b.c.AddChain(&nftables.Chain{Name: name, Table: b.t})
}

// rule appends to ch a rule made of the parts in order; all must match for
// the last part's verdict to apply.
func (b *builder) rule(ch *nftables.Chain, parts ...[]expr.Any) {
	var exprs []expr.Any
	for _, p := range parts {
		exprs = append(exprs, p...)
	}
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: ch, Exprs: exprs})
}

func (b *builder) ipv4(pod4 *nftables.Set) {
	ch := b.chain(chainIPv4)
	b.rule(ch, in(expr.PayloadBaseNetworkHeader, ip4Src, pod4), accept())
	b.rule(ch, countDrop())
}

func (b *builder) arp(pod4 *nftables.Set) {
	nh := expr.PayloadBaseNetworkHeader
	ch := b.chain(chainARP)
	b.rule(ch,
		is(nh, arpHType, be16(1)), // Ethernet
		is(nh, arpPType, etherIPv4),
		is(nh, arpHLen, []byte{6}),
		is(nh, arpPLen, []byte{4}),
		load(nh, arpOp, 2), between(be16(1), be16(2)), // request, reply
		is(nh, arpSHA, b.mac),
		in(nh, arpSPA, pod4),
		accept())
	b.rule(ch, countDrop())
}

func (b *builder) ipv6(pod6 *nftables.Set) {
	nh := expr.PayloadBaseNetworkHeader
	icmp := is(nh, ip6NextHdr, []byte{unix.IPPROTO_ICMPV6})
	icmpType := func(typ byte) []expr.Any { return is(nh, icmp6Type, []byte{typ}) }

	// Chains before rules: a goto must name a chain that exists.
	chains := make(map[string]*nftables.Chain)
	for _, name := range []string{chainIPv6, chainUnspecified, chainICMPv6, chainNS, chainNA} {
		chains[name] = b.chain(name)
	}

	ch := chains[chainIPv6]
	b.rule(ch, is(nh, ip6Src, ipv6Unspecified), goTo(chainUnspecified))
	b.rule(ch, in(nh, ip6Src, pod6), goTo(chainICMPv6))
	b.rule(ch, linkLocalAt(ip6Src), goTo(chainICMPv6))
	b.rule(ch, countDrop())

	// Duplicate address detection probes, the one thing sent from ::.
	ch = chains[chainUnspecified]
	b.rule(ch, icmp, icmpType(icmp6NeighborSolic), in(nh, ndTarget, pod6), accept())
	b.rule(ch, icmp, icmpType(icmp6NeighborSolic), linkLocalAt(ndTarget), accept())
	b.rule(ch, countDrop())

	ch = chains[chainICMPv6]
	b.rule(ch, icmp, icmpType(icmp6RouterAdvert), countDrop())
	b.rule(ch, icmp, icmpType(icmp6Redirect), countDrop())
	b.rule(ch, icmp, icmpType(icmp6NeighborSolic), goTo(chainNS))
	b.rule(ch, icmp, icmpType(icmp6NeighborAdvert), goTo(chainNA))
	// NDP behind extension headers: only nftables' own parse of the chain
	// of headers finds the ICMPv6 header. A packet it cannot parse fails
	// the meta and @th loads and passes on its source alone; the kernel's
	// IPv6 input, which parses the same way, drops it.
	b.rule(ch,
		load(nh, ip6NextHdr, 1), neq([]byte{unix.IPPROTO_ICMPV6}),
		[]expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}}, eq([]byte{unix.IPPROTO_ICMPV6}),
		load(expr.PayloadBaseTransportHeader, 0, 1), between([]byte{icmp6RouterAdvert}, []byte{icmp6Redirect}),
		countDrop())
	b.rule(ch, accept())

	ch = chains[chainNS]
	b.rule(ch, is(nh, ip6PayloadLen, ndPlain), accept())
	b.rule(ch, is(nh, ip6PayloadLen, ndWithAddr), is(nh, ndOption, optSourceAddr), is(nh, ndOptionAddr, b.mac), accept())
	b.rule(ch, countDrop())

	ch = chains[chainNA]
	for _, target := range [][]expr.Any{in(nh, ndTarget, pod6), linkLocalAt(ndTarget)} {
		b.rule(ch, target, is(nh, ip6PayloadLen, ndPlain), accept())
		b.rule(ch, target, is(nh, ip6PayloadLen, ndWithAddr), is(nh, ndOption, optTargetAddr), is(nh, ndOptionAddr, b.mac), accept())
	}
	b.rule(ch, countDrop())
}

// Expression helpers. Every rule works in register 1 (16 bytes, enough for
// an IPv6 address): a load, then a comparison of what it loaded.

func load(base expr.PayloadBase, offset, n uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: n}}
}

func eq(data []byte) []expr.Any {
	return []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

func neq(data []byte) []expr.Any {
	return []expr.Any{&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data}}
}

func between(from, to []byte) []expr.Any {
	return []expr.Any{&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: from, ToData: to}}
}

// is matches when the len(data) bytes at offset from base equal data.
func is(base expr.PayloadBase, offset uint32, data []byte) []expr.Any {
	return append(load(base, offset, uint32(len(data))), eq(data)...)
}

// in matches when the address at offset from base is in s.
func in(base expr.PayloadBase, offset uint32, s *nftables.Set) []expr.Any {
	return append(load(base, offset, s.KeyType.Bytes),
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
}

// linkLocalAt matches when the IPv6 address at offset in the network
// header is in fe80::/10.
func linkLocalAt(offset uint32) []expr.Any {
	return append(load(expr.PayloadBaseNetworkHeader, offset, 2),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: linkLocalMask, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: linkLocal})
}

func countDrop() []expr.Any {
	return []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterName},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

func accept() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
}

func goTo(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func be16(v uint16) []byte {
	return []byte{byte(v >> 8), byte(v)}
}

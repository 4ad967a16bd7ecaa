package podkernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/node/nfttable"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Divert describes how the applications' TCP and UDP reach the stack's
// kernel sockets instead of the TUN (the Istio/Envoy TPROXY pattern):
//
//   - output: TCP (except a connection's first SYN), UDP and ICMP errors
//     that the kernel routes into the TUN are marked, and the mark's routing
//     table delivers them locally, over lo, where the stack's sockets (bound
//     to the remote peers' addresses) receive them;
//   - an application's SYN still goes into the TUN: the stack dials the
//     remote first and writes the SYN back into the TUN only when the
//     remote accepted (or a RST when it refused), so connect() sees
//     refusals as refusals; written back, the SYN is handed to the TCP
//     listener by tproxy;
//   - a datagram to a peer without a flow is handed to the UDP listener by
//     tproxy, with its original destination.
type Divert struct {
	// TUN is the applications' device. Required.
	TUN string
	// TCP4, TCP6, UDP4, UDP6 are the listeners' loopback addresses; an
	// invalid one (IPv6 in a pod without IPv6) gets no rule.
	TCP4, TCP6, UDP4, UDP6 netip.AddrPort
}

const (
	// DivertMark marks the packets Divert reroutes; DivertTable is the
	// routing table their rule looks up. Both spell "usn" and are unlikely
	// to meet a mesh's own (Istio uses 0x539 and table 133).
	DivertMark  = 0x75736e
	DivertTable = 0x75736e
	// divertPriority orders our policy rule before main (32766).
	divertPriority = 0x7573
	// DivertTableName is the nftables table (family inet) in the pod.
	DivertTableName = "cni-usernet-divert"
)

// InstallDivert sets the routing and the nftables rules up in the calling
// thread's network namespace. It is idempotent: a restarted stack calls it
// again with its new listeners' ports.
func InstallDivert(d Divert) error {
	tun, err := netlinksafe.LinkByName(d.TUN)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", d.TUN, err)
	}
	lo, err := netlinksafe.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("looking up lo: %w", err)
	}
	// The stack's sockets reach the applications over loopback. Runtimes
	// bring lo up (the loopback plugin) but need not have done so before
	// the pod's network plugin runs.
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	// Packets the stack writes into the TUN carry the pod's own address as
	// source (a re-injected SYN) or a remote's; the kernel drops the former
	// as martian unless told otherwise.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+d.TUN+"/accept_local", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("accepting local sources on %s: %w", d.TUN, err)
	}
	families := []int{unix.AF_INET}
	if d.TCP6.IsValid() {
		families = append(families, unix.AF_INET6)
	}
	for _, fam := range families {
		rule := netlink.NewRule()
		rule.Family = fam
		rule.Mark = DivertMark
		mask := uint32(0xffffffff)
		rule.Mask = &mask
		rule.Table = DivertTable
		rule.Priority = divertPriority
		if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding the policy rule for marked packets: %w", err)
		}
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if fam == unix.AF_INET6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		route := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Table: DivertTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("adding the local route of table %d: %w", DivertTable, err)
		}
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Name: DivertTableName, Family: nftables.TableFamilyINet}
	if err := nfttable.Replace(c, t); err != nil {
		return fmt.Errorf("installing nftables table %s: %w", DivertTableName, err)
	}
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeRoute,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	tunIdx, loIdx := uint32(tun.Attrs().Index), uint32(lo.Attrs().Index)
	for _, r := range divertRules(d, tunIdx, loIdx) {
		ch := out
		if r.pre {
			ch = pre
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables table %s: %w", DivertTableName, err)
	}
	return nil
}

type nftRule struct {
	pre   bool
	exprs []expr.Any
}

const (
	nfprotoIPv4 = unix.NFPROTO_IPV4
	nfprotoIPv6 = unix.NFPROTO_IPV6
	tcpSyn      = 0x02
	tcpSynAck   = 0x12
)

func divertRules(d Divert, tun, lo uint32) []nftRule {
	setMark := []expr.Any{
		&expr.Immediate{Register: 1, Data: le32(DivertMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
	var rules []nftRule
	// output: everything but a first SYN, UDP, and ICMP errors (echo
	// requests stay in the TUN for the stack's pinger).
	rules = append(rules,
		nftRule{exprs: cat(ifIs(expr.MetaKeyOIF, tun), l4Is(unix.IPPROTO_TCP), tcpFlags(expr.CmpOpNeq), setMark)},
		nftRule{exprs: cat(ifIs(expr.MetaKeyOIF, tun), l4Is(unix.IPPROTO_UDP), setMark)},
		nftRule{exprs: cat(ifIs(expr.MetaKeyOIF, tun), l4Is(unix.IPPROTO_ICMP), icmpType(expr.CmpOpNeq, 8), setMark)},
		nftRule{exprs: cat(ifIs(expr.MetaKeyOIF, tun), l4Is(unix.IPPROTO_ICMPV6), icmpType(expr.CmpOpLt, 128), setMark)},
	)
	// prerouting: SYNs the stack writes back into the TUN go to the TCP
	// listener; marked datagrams without a flow socket to the UDP one.
	for _, l := range []struct {
		ap   netip.AddrPort
		tcp  bool
		nfp  byte
		ifix uint32
	}{{d.TCP4, true, nfprotoIPv4, tun}, {d.TCP6, true, nfprotoIPv6, tun}, {d.UDP4, false, nfprotoIPv4, lo}, {d.UDP6, false, nfprotoIPv6, lo}} {
		if !l.ap.IsValid() {
			continue
		}
		var match []expr.Any
		if l.tcp {
			match = cat(ifIs(expr.MetaKeyIIF, l.ifix), nfproto(l.nfp), l4Is(unix.IPPROTO_TCP), tcpFlags(expr.CmpOpEq))
		} else {
			match = cat(ifIs(expr.MetaKeyIIF, l.ifix), nfproto(l.nfp), l4Is(unix.IPPROTO_UDP), markIs())
		}
		fam := byte(unix.NFPROTO_IPV4)
		if l.nfp == nfprotoIPv6 {
			fam = unix.NFPROTO_IPV6
		}
		port := make([]byte, 2)
		binary.BigEndian.PutUint16(port, l.ap.Port())
		rules = append(rules, nftRule{pre: true, exprs: cat(match, setMark, []expr.Any{
			&expr.Immediate{Register: 1, Data: l.ap.Addr().AsSlice()},
			&expr.Immediate{Register: 2, Data: port},
			&expr.TProxy{Family: fam, TableFamily: byte(nftables.TableFamilyINet), RegAddr: 1, RegPort: 2},
			&expr.Verdict{Kind: expr.VerdictAccept},
		})})
	}
	return rules
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func le32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

func ifIs(key expr.MetaKey, idx uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(idx)},
	}
}

func l4Is(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func markIs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(DivertMark)},
	}
}

// tcpFlags compares the SYN and ACK bits with "SYN alone".
func tcpFlags(op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSynAck}, Xor: []byte{0}},
		&expr.Cmp{Op: op, Register: 1, Data: []byte{tcpSyn}},
	}
}

func icmpType(op expr.CmpOp, typ byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte{typ}},
	}
}

// RemoveDivert undoes InstallDivert in the calling thread's network
// namespace; what is already gone is success.
func RemoveDivert() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Name: DivertTableName, Family: nftables.TableFamilyINet}
	c.AddTable(t) // makes the delete valid when the table is gone
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing nftables table %s: %w", DivertTableName, err)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := netlinksafe.RuleList(fam)
		if err != nil {
			return fmt.Errorf("listing policy rules: %w", err)
		}
		for _, r := range rules {
			if r.Table != DivertTable {
				continue
			}
			if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("removing the policy rule for marked packets: %w", err)
			}
		}
		routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: DivertTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing routes of table %d: %w", DivertTable, err)
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("removing the local route of table %d: %w", DivertTable, err)
			}
		}
	}
	return nil
}

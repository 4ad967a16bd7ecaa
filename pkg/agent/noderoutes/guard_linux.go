package noderoutes

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/node/nfttable"
)

// GuardTable is the nftables table (family inet) that keeps the VXLAN
// port to the other nodes: a VXLAN device takes any datagram to its port
// and VNI, from anywhere that reaches the node, and the VNI is no secret,
// so a pod or a host on the underlay could otherwise put frames on this
// node's overlay with any inner source. Calico drops the port from all
// but the known nodes the same way; flannel does not.
const GuardTable = "cni-usernet-vxlan"

// The guard's sets: the port, and each family's allowed sources (the
// InternalIPs of the other nodes). The sets are the guard's record in
// the kernel: a sync compares their elements with what it wants.
const (
	guardPorts  = "port"
	guardPeers4 = "peers4"
	guardPeers6 = "peers6"
)

// guard is what the table must hold.
type guard struct {
	port   uint16
	peers4 [][]byte
	peers6 [][]byte
}

// guardFor allows each other node's InternalIPs, whether this node
// reaches it through VXLAN or not: a node that sees this one behind a
// router sends VXLAN even when this one reaches it directly.
func guardFor(self string, nodes []Node, port int) guard {
	g := guard{port: uint16(port)}
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		for _, ip := range n.InternalIPs {
			if ip = ip.Unmap(); ip.Is4() {
				g.peers4 = append(g.peers4, ip.AsSlice())
			} else if ip.IsValid() {
				g.peers6 = append(g.peers6, ip.AsSlice())
			}
		}
	}
	for _, s := range []*[][]byte{&g.peers4, &g.peers6} {
		slices.SortFunc(*s, func(a, b []byte) int { return slices.Compare(a, b) })
		*s = slices.CompactFunc(*s, slices.Equal)
	}
	return g
}

func (g guard) sets() map[string][][]byte {
	port := binary.BigEndian.AppendUint16(nil, g.port)
	return map[string][][]byte{guardPorts: {port}, guardPeers4: g.peers4, guardPeers6: g.peers6}
}

// syncGuard makes the table hold g, replacing it whole when any set
// differs or it is missing.
func (m *Manager) syncGuard(g guard) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Name: GuardTable, Family: nftables.TableFamilyINet}
	if guardHolds(c, t, g) {
		return nil
	}
	if err := nfttable.Replace(c, t); err != nil {
		return fmt.Errorf("installing nftables table %s: %w", GuardTable, err)
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	sets := map[string]*nftables.Set{}
	for name, typ := range map[string]nftables.SetDatatype{guardPorts: nftables.TypeInetService,
		guardPeers4: nftables.TypeIPAddr, guardPeers6: nftables.TypeIP6Addr} {
		s := &nftables.Set{Table: t, Name: name, KeyType: typ}
		var elems []nftables.SetElement
		for _, k := range g.sets()[name] {
			elems = append(elems, nftables.SetElement{Key: k})
		}
		if err := c.AddSet(s, elems); err != nil {
			return fmt.Errorf("adding the nftables set %s: %w", name, err)
		}
		sets[name] = s
	}
	for _, f := range []struct {
		nfproto     byte
		off, length uint32
		peers       string
	}{{unix.NFPROTO_IPV4, 12, 4, guardPeers4}, {unix.NFPROTO_IPV6, 8, 16, guardPeers6}} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: guardPorts, SetID: sets[guardPorts].ID},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.off, Len: f.length},
			&expr.Lookup{SourceRegister: 1, SetName: f.peers, SetID: sets[f.peers].ID, Invert: true},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables table %s: %w", GuardTable, err)
	}
	m.log.Info("VXLAN port kept to the other nodes", "table", GuardTable, "port", g.port,
		"peers", len(g.peers4)+len(g.peers6))
	return nil
}

// guardHolds says whether the table is there with its two rules and
// exactly g's sets.
func guardHolds(c *nftables.Conn, t *nftables.Table, g guard) bool {
	rules, err := c.GetRules(t, &nftables.Chain{Name: "input", Table: t})
	if err != nil || len(rules) != 2 {
		return false
	}
	for name, want := range g.sets() {
		s, err := c.GetSetByName(t, name)
		if err != nil {
			return false
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return false
		}
		var have [][]byte
		for _, e := range elems {
			have = append(have, e.Key)
		}
		slices.SortFunc(have, func(a, b []byte) int { return slices.Compare(a, b) })
		if !slices.EqualFunc(have, want, slices.Equal) {
			return false
		}
	}
	return true
}

// removeGuard deletes the table; absent is success.
func (m *Manager) removeGuard() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == GuardTable {
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return fmt.Errorf("removing nftables table %s: %w", GuardTable, err)
			}
			m.log.Info("VXLAN port guard removed", "table", GuardTable)
		}
	}
	return nil
}

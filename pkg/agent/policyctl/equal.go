package policyctl

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/netip"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// policyDigest identifies what a policy enforces (its generation aside):
// two policies with the same digest enforce the same thing.
//
// The controller keeps a digest of what each stack holds, not the policy:
// at 100k pods a pod's rules can admit 10,000 addresses, and 100 local
// pods' policies held whole were a third of the agent's live heap. The
// digest is SHA-256 over every field, each string and list preceded by
// its length, so that no two policies share an input; a change a pod's
// neighbours could craft to collide with another would need a SHA-256
// collision. It walks the compiled policy (no encoding to JSON, which
// policy.Equal does), once per compiled pod and round.
type policyDigest [sha256.Size]byte

func digestOf(p *policy.PodPolicy) policyDigest {
	d := digester{h: sha256.New()}
	d.int(uint64(p.Version))
	d.direction(&p.Ingress)
	d.direction(&p.Egress)
	d.int(uint64(len(p.Node)))
	for _, a := range p.Node {
		d.addr(a)
	}
	d.int(uint64(len(p.Services)))
	for i := range p.Services {
		s := &p.Services[i]
		d.str(s.Name)
		d.str(string(s.Protocol))
		d.addrPort(s.VIP)
		d.int(uint64(len(s.Backends)))
		for _, b := range s.Backends {
			d.addrPort(b.Addr)
		}
	}
	d.flush()
	var out policyDigest
	d.h.Sum(out[:0])
	return out
}

// digester writes fields into h, each in a form that cannot run into the
// next; buf is reused across writes.
type digester struct {
	h   hash.Hash
	buf []byte
}

func (d *digester) flush() {
	d.h.Write(d.buf)
	d.buf = d.buf[:0]
}

func (d *digester) int(n uint64) {
	d.buf = binary.AppendUvarint(d.buf, n)
	if len(d.buf) > 4096 {
		d.flush()
	}
}

func (d *digester) str(s string) {
	d.int(uint64(len(s)))
	d.buf = append(d.buf, s...)
}

func (d *digester) addr(a netip.Addr) {
	b, _ := a.MarshalBinary() // never fails
	d.int(uint64(len(b)))
	d.buf = append(d.buf, b...)
}

func (d *digester) addrPort(a netip.AddrPort) {
	d.addr(a.Addr())
	d.int(uint64(a.Port()))
}

func (d *digester) prefix(p netip.Prefix) {
	d.addr(p.Addr())
	d.int(uint64(p.Bits() + 1)) // an invalid prefix's -1 included
}

func (d *digester) direction(dir *policy.Direction) {
	if dir.Isolated {
		d.int(1)
	} else {
		d.int(0)
	}
	d.int(uint64(len(dir.Policies)))
	for _, s := range dir.Policies {
		d.str(s)
	}
	d.int(uint64(len(dir.Rules)))
	for i := range dir.Rules {
		r := &dir.Rules[i]
		d.rule(r.Policy, r.Ports, r.Peers)
	}
	// The ClusterNetworkPolicy tiers, each rule with its action and
	// name.
	for _, tier := range [][]policy.TierRule{dir.Admin, dir.Baseline} {
		d.int(uint64(len(tier)))
		for i := range tier {
			r := &tier[i]
			d.str(string(r.Action))
			d.str(r.Name)
			d.rule(r.Policy, r.Ports, r.Peers)
		}
	}
	d.flush()
}

func (d *digester) rule(pol string, ports []policy.PortRange, peers []policy.Peer) {
	d.str(pol)
	d.int(uint64(len(ports)))
	for _, p := range ports {
		d.str(string(p.Protocol))
		d.int(uint64(p.First))
		d.int(uint64(p.Last))
	}
	d.int(uint64(len(peers)))
	for _, p := range peers {
		d.prefix(p.CIDR)
		d.int(uint64(len(p.Except)))
		for _, e := range p.Except {
			d.prefix(e)
		}
	}
}

// heldPolicy is what a stack holds, as the controller remembers it.
type heldPolicy struct {
	digest     policyDigest
	generation uint64
}

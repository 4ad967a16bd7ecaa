package sockmap

import (
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// ctLayout is where the service program finds the node's translation
// of a packet: sk_buff._nfct points at its nf_conn (the low bits are
// its ctinfo), whose original-direction tuple is the connection as its
// client opened it, before the node's DNAT. Offsets and type IDs come
// from the running kernel's BTF; castCtxID is the bpf_cast_to_kern_ctx
// kfunc's, which turns the program's __sk_buff into the kernel's.
type ctLayout struct {
	nfctOff      int16
	connTypeID   int32
	castCtxID    int64
	srcAddrOff   int16 // tuplehash[IP_CT_DIR_ORIGINAL].tuple.src.u3
	srcPortOff   int16 // .src.u.all (__be16)
	l3numOff     int16 // .src.l3num (u16)
	dstAddrOff   int16 // .dst.u3
	dstPortOff   int16 // .dst.u.all (__be16)
	protonumOff  int16 // .dst.protonum (u8)
	supportedErr error // why Service joins are off, when they are
}

// ctLayoutIn reads the conntrack layout from a kernel's BTF. A kernel
// without conntrack in its BTF (a module's BTF, or none) still runs the
// redirect; only joins through a Service's cluster IP are off, and
// supportedErr says why.
func ctLayoutIn(spec *btf.Spec) ctLayout {
	l, err := readCtLayout(spec)
	if err != nil {
		return ctLayout{supportedErr: err}
	}
	return l
}

func readCtLayout(spec *btf.Spec) (ctLayout, error) {
	var l ctLayout
	nfct, err := memberPath(spec, "sk_buff", "_nfct")
	if err != nil {
		return l, err
	}
	tuple, err := memberPath(spec, "nf_conn", "tuplehash", "tuple")
	if err != nil {
		return l, err
	}
	offs := []struct {
		path []string
		dst  *int16
	}{
		{[]string{"src", "u3"}, &l.srcAddrOff},
		{[]string{"src", "u"}, &l.srcPortOff},
		{[]string{"src", "l3num"}, &l.l3numOff},
		{[]string{"dst", "u3"}, &l.dstAddrOff},
		{[]string{"dst", "u"}, &l.dstPortOff},
		{[]string{"dst", "protonum"}, &l.protonumOff},
	}
	for _, o := range offs {
		off, err := memberPath(spec, "nf_conntrack_tuple", o.path...)
		if err != nil {
			return l, err
		}
		*o.dst = int16(tuple + off)
	}
	l.nfctOff = int16(nfct)
	var conn *btf.Struct
	if err := spec.TypeByName("nf_conn", &conn); err != nil {
		return l, fmt.Errorf("%w: struct nf_conn: %v", ErrUnsupported, err)
	}
	connID, err := spec.TypeID(conn)
	if err != nil {
		return l, fmt.Errorf("%w: struct nf_conn's BTF ID: %v", ErrUnsupported, err)
	}
	var cast *btf.Func
	if err := spec.TypeByName("bpf_cast_to_kern_ctx", &cast); err != nil {
		return l, fmt.Errorf("%w: the bpf_cast_to_kern_ctx kfunc: %v", ErrUnsupported, err)
	}
	castID, err := spec.TypeID(cast)
	if err != nil {
		return l, fmt.Errorf("%w: bpf_cast_to_kern_ctx's BTF ID: %v", ErrUnsupported, err)
	}
	l.connTypeID, l.castCtxID = int32(connID), int64(castID)
	return l, nil
}

// memberPath is the byte offset of typ.path[0].path[1]... in struct typ:
// anonymous members are searched through, and an array member stands
// for its first element.
func memberPath(spec *btf.Spec, typ string, path ...string) (uint32, error) {
	var s *btf.Struct
	if err := spec.TypeByName(typ, &s); err != nil {
		return 0, fmt.Errorf("%w: struct %s: %v", ErrUnsupported, typ, err)
	}
	var t btf.Type = s
	var off uint32
	for _, name := range path {
		m, at, ok := findMember(t, name)
		if !ok {
			return 0, fmt.Errorf("%w: %s has no %v", ErrUnsupported, typ, path)
		}
		if at%8 != 0 {
			return 0, fmt.Errorf("%w: %s's %s is a bit field", ErrUnsupported, typ, name)
		}
		off += at / 8
		t = btf.UnderlyingType(m.Type)
		if a, ok := t.(*btf.Array); ok {
			t = btf.UnderlyingType(a.Type)
		}
	}
	if off > 1<<15-1 {
		return 0, fmt.Errorf("%w: %s's %v at byte %d", ErrUnsupported, typ, path, off)
	}
	return off, nil
}

// findMember finds name in the struct or union t, looking through its
// anonymous members; at is the member's bit offset in t.
func findMember(t btf.Type, name string) (btf.Member, uint32, bool) {
	var members []btf.Member
	switch c := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		members = c.Members
	case *btf.Union:
		members = c.Members
	default:
		return btf.Member{}, 0, false
	}
	for _, m := range members {
		if m.Name == name {
			return m, uint32(m.Offset), true
		}
		if m.Name == "" {
			if inner, at, ok := findMember(m.Type, name); ok {
				return inner, uint32(m.Offset) + at, true
			}
		}
	}
	return btf.Member{}, 0, false
}

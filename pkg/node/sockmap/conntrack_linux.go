package sockmap

import (
	"github.com/cilium/ebpf/btf"
)

// ctLayout is where the service program finds the node's translation
// of a packet: sk_buff._nfct points at its nf_conn (the low bits are
// its ctinfo), whose original-direction tuple is the connection as its
// client opened it, before the node's DNAT. Offsets and type IDs come
// from the running kernel's BTF; castCtxID is the bpf_cast_to_kern_ctx
// kfunc's, which turns the program's __sk_buff into the kernel's.
type ctLayout struct {
	nfctOff     int16
	connTypeID  int32
	castCtxID   int64
	srcAddrOff  int16 // tuplehash[IP_CT_DIR_ORIGINAL].tuple.src.u3
	srcPortOff  int16 // .src.u.all (__be16)
	l3numOff    int16 // .src.l3num (u16)
	dstAddrOff  int16 // .dst.u3
	dstPortOff  int16 // .dst.u.all (__be16)
	protonumOff int16 // .dst.protonum (u8)
}

// ctLayoutIn reads the conntrack layout from a kernel's BTF. A kernel
// without conntrack in its BTF (a module's BTF, or none) still runs the
// redirect; only joins through a Service's cluster IP are off.
func ctLayoutIn(spec *btf.Spec) (ctLayout, error) {
	var l ctLayout
	nfct, err := memberPath(spec, "sk_buff", "_nfct")
	if err != nil {
		return l, err
	}
	tuple, err := memberPath(spec, "nf_conn", "tuplehash", "tuple")
	if err != nil {
		return l, err
	}
	for _, o := range []struct {
		path []string
		dst  *int16
	}{
		{[]string{"src", "u3"}, &l.srcAddrOff},
		{[]string{"src", "u"}, &l.srcPortOff},
		{[]string{"src", "l3num"}, &l.l3numOff},
		{[]string{"dst", "u3"}, &l.dstAddrOff},
		{[]string{"dst", "u"}, &l.dstPortOff},
		{[]string{"dst", "protonum"}, &l.protonumOff},
	} {
		off, err := memberPath(spec, "nf_conntrack_tuple", o.path...)
		if err != nil {
			return l, err
		}
		*o.dst = int16(tuple + off)
	}
	connID, err := typeID[*btf.Struct](spec, "nf_conn")
	if err != nil {
		return l, err
	}
	castID, err := typeID[*btf.Func](spec, "bpf_cast_to_kern_ctx")
	if err != nil {
		return l, err
	}
	l.nfctOff, l.connTypeID, l.castCtxID = int16(nfct), int32(connID), int64(castID)
	return l, nil
}

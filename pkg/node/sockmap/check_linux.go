package sockmap

import (
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// Check says whether the running kernel has what the programs (the
// verdict, and sock_ops on its RTT callbacks) read through BTF, and
// where: the socket's sk_user_data, its psock's msg_tot_len (the unread
// redirected bytes; kernels without it cannot bound a reader), the
// bpf_rdonly_cast kfunc, and tcp_sock's bytes_received, rcv_nxt and
// copied_seq (what a socket read of its TCP stream). The helpers the programs
// call are checked by loading them.
func Check() (psockLayout, error) {
	spec, err := kernelSpec()
	if err != nil {
		return psockLayout{}, err
	}
	return layoutIn(spec)
}

func kernelSpec() (*btf.Spec, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("%w: the kernel's BTF: %v", ErrUnsupported, err)
	}
	return spec, nil
}

// layoutIn reads the layout from a kernel's BTF.
func layoutIn(spec *btf.Spec) (psockLayout, error) {
	var l psockLayout
	userData, err := memberPath(spec, "sock", "sk_user_data")
	if err != nil {
		return l, err
	}
	totLen, err := memberPath(spec, "sk_psock", "msg_tot_len")
	if err != nil {
		return l, err
	}
	psockID, err := typeID[*btf.Struct](spec, "sk_psock")
	if err != nil {
		return l, err
	}
	castID, err := typeID[*btf.Func](spec, "bpf_rdonly_cast")
	if err != nil {
		return l, err
	}
	l = psockLayout{userDataOff: int16(userData), msgTotLenOff: int16(totLen), psockTypeID: int32(psockID), castID: int64(castID)}
	for _, f := range []struct {
		name string
		off  *int16
	}{{"bytes_received", &l.bytesReceivedOff}, {"rcv_nxt", &l.rcvNxtOff}, {"copied_seq", &l.copiedSeqOff}} {
		off, err := memberPath(spec, "tcp_sock", f.name)
		if err != nil {
			return psockLayout{}, err
		}
		*f.off = int16(off)
	}
	return l, nil
}

// typeID is the BTF ID of the struct or kfunc (T) name in spec.
func typeID[T btf.Type](spec *btf.Spec, name string) (btf.TypeID, error) {
	var t T
	if err := spec.TypeByName(name, &t); err != nil {
		return 0, fmt.Errorf("%w: %s in the kernel's BTF: %v", ErrUnsupported, name, err)
	}
	id, err := spec.TypeID(t)
	if err != nil {
		return 0, fmt.Errorf("%w: %s's BTF ID: %v", ErrUnsupported, name, err)
	}
	return id, nil
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
			return 0, fmt.Errorf("%w: struct %s has no %v", ErrUnsupported, typ, path)
		}
		if at%8 != 0 {
			return 0, fmt.Errorf("%w: struct %s's %s is a bit field", ErrUnsupported, typ, name)
		}
		off += at / 8
		t = btf.UnderlyingType(m.Type)
		if a, ok := t.(*btf.Array); ok {
			t = btf.UnderlyingType(a.Type)
		}
	}
	if off > 1<<15-1 {
		return 0, fmt.Errorf("%w: struct %s's %v at byte %d", ErrUnsupported, typ, path, off)
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

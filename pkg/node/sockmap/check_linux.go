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
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return psockLayout{}, fmt.Errorf("%w: the kernel's BTF: %v", ErrUnsupported, err)
	}
	return layoutIn(spec)
}

// layoutIn reads the layout from a kernel's BTF.
func layoutIn(spec *btf.Spec) (psockLayout, error) {
	var l psockLayout
	userData, err := memberOffset(spec, "sock", "sk_user_data")
	if err != nil {
		return l, err
	}
	totLen, err := memberOffset(spec, "sk_psock", "msg_tot_len")
	if err != nil {
		return l, err
	}
	var psock *btf.Struct
	if err := spec.TypeByName("sk_psock", &psock); err != nil {
		return l, fmt.Errorf("%w: struct sk_psock: %v", ErrUnsupported, err)
	}
	psockID, err := spec.TypeID(psock)
	if err != nil {
		return l, fmt.Errorf("%w: struct sk_psock's BTF ID: %v", ErrUnsupported, err)
	}
	var cast *btf.Func
	if err := spec.TypeByName("bpf_rdonly_cast", &cast); err != nil {
		return l, fmt.Errorf("%w: the bpf_rdonly_cast kfunc: %v", ErrUnsupported, err)
	}
	castID, err := spec.TypeID(cast)
	if err != nil {
		return l, fmt.Errorf("%w: bpf_rdonly_cast's BTF ID: %v", ErrUnsupported, err)
	}
	l = psockLayout{userDataOff: int16(userData), msgTotLenOff: int16(totLen), psockTypeID: int32(psockID), castID: int64(castID)}
	for _, f := range []struct {
		name string
		off  *int16
	}{{"bytes_received", &l.bytesReceivedOff}, {"rcv_nxt", &l.rcvNxtOff}, {"copied_seq", &l.copiedSeqOff}} {
		off, err := memberOffset(spec, "tcp_sock", f.name)
		if err != nil {
			return psockLayout{}, err
		}
		*f.off = int16(off)
	}
	return l, nil
}

func memberOffset(spec *btf.Spec, typ, member string) (uint32, error) {
	var s *btf.Struct
	if err := spec.TypeByName(typ, &s); err != nil {
		return 0, fmt.Errorf("%w: struct %s: %v", ErrUnsupported, typ, err)
	}
	for _, m := range s.Members {
		if m.Name == member {
			if m.Offset%8 != 0 || m.Offset.Bytes() > 1<<15-1 {
				return 0, fmt.Errorf("%w: struct %s's %s at bit %d", ErrUnsupported, typ, member, m.Offset)
			}
			return m.Offset.Bytes(), nil
		}
	}
	return 0, fmt.Errorf("%w: struct %s has no %s", ErrUnsupported, typ, member)
}

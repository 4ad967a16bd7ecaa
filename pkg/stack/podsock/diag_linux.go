package podsock

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listener is a TCP socket listening in the pod's kernel.
type Listener struct {
	Addr netip.AddrPort // unspecified address: all of the family's
	// V6Only: an IPv6 listener that takes no IPv4 connections.
	V6Only bool
}

// Diag lists the pod kernel's listening TCP sockets over one
// NETLINK_SOCK_DIAG socket, opened during setup and kept, since the
// sandboxed stack cannot open netlink sockets.
type Diag struct {
	mu  sync.Mutex // guards fd and buf: one dump at a time
	fd  int
	buf []byte
	seq uint32
}

// OpenDiag opens the netlink socket.
func OpenDiag() (*Diag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("opening a sock_diag socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding the sock_diag socket: %w", err)
	}
	return &Diag{fd: fd, buf: make([]byte, 64<<10)}, nil
}

// Close closes the socket.
func (d *Diag) Close() error { return unix.Close(d.fd) }

const (
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	tcpListen         = 10 // TCP_LISTEN
	inetDiagReqV2Len  = 56
	inetDiagMsgLen    = 72
	inetDiagSkV6Only  = 11 // INET_DIAG_SKV6ONLY
	inetDiagSockIDOff = 4  // sockid in both request and message
)

// Listeners dumps the listening TCP sockets of both families.
func (d *Diag) Listeners() ([]Listener, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Listener
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		l, err := d.dump(fam)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

func (d *Diag) dump(family uint8) ([]Listener, error) {
	d.seq++
	req := make([]byte, unix.NLMSG_HDRLEN+inetDiagReqV2Len)
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:12], d.seq)
	r := req[unix.NLMSG_HDRLEN:]
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:8], 1<<tcpListen)
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("asking for listening sockets: %w", err)
	}
	var out []Listener
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if err != nil {
			return nil, fmt.Errorf("reading listening sockets: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(d.buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parsing listening sockets: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != d.seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
						return nil, fmt.Errorf("listing listening sockets: %w", unix.Errno(-errno))
					}
				}
				return out, nil
			case sockDiagByFamily:
				if l, ok := parseListener(m.Data); ok {
					out = append(out, l)
				}
			}
		}
	}
}

// parseListener reads an inet_diag_msg and its attributes.
func parseListener(b []byte) (Listener, bool) {
	if len(b) < inetDiagMsgLen {
		return Listener{}, false
	}
	id := b[inetDiagSockIDOff:]
	port := binary.BigEndian.Uint16(id[0:2])
	var addr netip.Addr
	switch b[0] {
	case unix.AF_INET:
		addr = netip.AddrFrom4([4]byte(id[4:8]))
	case unix.AF_INET6:
		addr = netip.AddrFrom16([16]byte(id[4:20]))
	default:
		return Listener{}, false
	}
	l := Listener{Addr: netip.AddrPortFrom(addr, port)}
	for a := b[inetDiagMsgLen:]; len(a) >= 4; {
		alen := int(binary.NativeEndian.Uint16(a[0:2]))
		if alen < 4 || alen > len(a) {
			break
		}
		if binary.NativeEndian.Uint16(a[2:4]) == inetDiagSkV6Only && alen >= 5 {
			l.V6Only = a[4] != 0
		}
		next := (alen + 3) &^ 3
		if next > len(a) {
			break
		}
		a = a[next:]
	}
	return l, true
}

// Package podsock opens the pod kernel's side of the relay: transparent
// TCP and UDP sockets that talk to the pod's applications from a remote
// peer's own address and port, and the listeners that receive what the
// applications send to the network (see podkernel.Divert for the routing
// that brings it there).
//
// Transparency (IP_TRANSPARENT / IPV6_TRANSPARENT) is what lets a socket
// bind an address the pod does not own and send from it; setting it needs
// CAP_NET_RAW, which is the one capability the sandboxed stack keeps.
package podsock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
)

// transparent is a net.Dialer / net.ListenConfig Control function that
// makes the socket transparent before it is bound, and, for UDP, asks for
// each datagram's original destination.
func transparent(origDst bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			v6 := network == "tcp6" || network == "udp6"
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			}
			if serr != nil {
				serr = fmt.Errorf("making the socket transparent: %w", serr)
				return
			}
			// Several flows may bind the same remote address and port (one
			// remote answering several pod sockets).
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
				return
			}
			if network == "tcp4" || network == "tcp6" {
				// The node's socket redirect hands what an application
				// sends to a socket with this mark straight to it. A
				// kernel that refuses the mark (it needs CAP_NET_RAW)
				// only keeps the loopback TCP.
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, podnet.StackSocketMark)
			}
			if !origDst {
				return
			}
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1)
			}
			if serr != nil {
				serr = fmt.Errorf("asking for original destinations: %w", serr)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

func network(proto string, a netip.Addr) string {
	if a.Is4() || a.Is4In6() {
		return proto + "4"
	}
	return proto + "6"
}

// ListenTCP opens a transparent TCP listener on addr (port 0: any free
// port); nftables tproxy hands it connections for addresses that are not
// its own.
func ListenTCP(addr netip.AddrPort, backlog int) (*net.TCPListener, error) {
	lc := net.ListenConfig{Control: transparent(false)}
	l, err := lc.Listen(context.Background(), network("tcp", addr.Addr()), addr.String())
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return l.(*net.TCPListener), nil
}

// ListenUDP opens a transparent UDP socket on addr that reports each
// datagram's original destination (ReadOrigDst).
func ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: transparent(true)}
	c, err := lc.ListenPacket(context.Background(), network("udp", addr.Addr()), addr.String())
	if err != nil {
		return nil, fmt.Errorf("listening on UDP %s: %w", addr, err)
	}
	return c.(*net.UDPConn), nil
}

// DialTCP connects to to from from, an address the pod need not own.
func DialTCP(ctx context.Context, from, to netip.AddrPort) (*net.TCPConn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(from), Control: transparent(false)}
	c, err := d.DialContext(ctx, network("tcp", to.Addr()), to.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// DialUDP opens a UDP socket bound to from, an address the pod need not
// own, and connected to to: it receives what to sends back to from.
func DialUDP(from, to netip.AddrPort) (*net.UDPConn, error) {
	d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(from), Control: transparent(false)}
	c, err := d.Dial(network("udp", to.Addr()), to.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// Refused reports whether a dial or read failed because nothing listens.
func Refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// TimedOut reports whether err is a timeout.
func TimedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// Reset ends c with a RST instead of a FIN.
func Reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// OrigDstOOBSize is enough out-of-band space for ReadOrigDst.
var OrigDstOOBSize = unix.CmsgSpace(unix.SizeofSockaddrInet6)

// ReadOrigDst reads one datagram and the destination it was sent to.
func ReadOrigDst(c *net.UDPConn, b, oob []byte) (n int, src, dst netip.AddrPort, err error) {
	n, oobn, _, from, err := c.ReadMsgUDPAddrPort(b, oob)
	if err != nil {
		return 0, src, dst, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return 0, src, dst, fmt.Errorf("parsing control messages: %w", err)
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet4:
			port := binary.BigEndian.Uint16(m.Data[2:4])
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), port)
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet6:
			port := binary.BigEndian.Uint16(m.Data[2:4])
			dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(m.Data[8:24])), port)
		}
	}
	if !dst.IsValid() {
		return 0, src, dst, fmt.Errorf("datagram from %s without its original destination", from)
	}
	return n, unmap(from), dst, nil
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// AddrPort returns a's address and port, IPv4 unmapped.
func AddrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return unmap(a.AddrPort())
	case *net.UDPAddr:
		return unmap(a.AddrPort())
	}
	return netip.AddrPort{}
}

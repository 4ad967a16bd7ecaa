package packetsock

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Link is the packet sockets of a pod's link, owned together: the link's
// socket and the optional ones beside it (synsplit_linux.go says why the
// link is read through three). Close closes them all.
type Link struct {
	// FD is the link's socket (Open): it receives every frame the SYN
	// and fragment sockets do not take. Always open.
	FD int
	// TX is a send-only socket on the link (Options.SendOnly); 0: none,
	// frames are sent on FD.
	TX int
	// SYN receives the link's new-connection SYNs (NewSYNSocket); nil:
	// FD does.
	SYN *SYNSocket
	// Fragments receives the link's IP fragments (OpenFragments); 0: FD
	// does.
	Fragments int
}

// LinkOptions configures OpenLink.
type LinkOptions struct {
	// Options is the link's socket's and the send socket's. IfName is
	// required.
	Options
	// SYN returns the link's SYN socket, called once the link's socket is
	// open: NewSYNSocket takes a grace period, which a caller can spend
	// by opening it ahead. The Link owns what it returns. Nil: no SYN
	// socket.
	SYN func() (*SYNSocket, error)
	// Fragments opens a fragment socket. Zero: none.
	Fragments bool
	// Send opens a send-only socket (Link.TX). Zero: none.
	Send bool
	// Warn hears of each optional socket the link goes without, and why;
	// the link's socket then takes that socket's frames. Nil: nobody.
	Warn func(msg string, err error)
}

// OpenLink opens the sockets of o.IfName's link, in the current network
// namespace (a packet socket stays bound to the namespace it was made
// in). Only the link's socket is required: when it cannot be opened
// OpenLink fails, with nothing left open, and without calling o.SYN;
// each optional socket that cannot be opened (or split from the link's)
// is done without.
func OpenLink(o LinkOptions) (*Link, error) {
	warn := o.Warn
	if warn == nil {
		warn = func(string, error) {}
	}
	fd, err := Open(o.Options)
	if err != nil {
		return nil, err
	}
	l := &Link{FD: fd}
	// Without a SYN socket (a kernel without PACKET_IGNORE_OUTGOING) the
	// link's socket carries the SYNs too: slower under a flood, the same
	// otherwise; without a fragment socket, the fragments.
	if o.SYN != nil {
		if l.SYN, err = o.SYN(); err != nil {
			warn("no SYN socket: a SYN flood shares the link's receive path", err)
			l.SYN = nil
		}
	}
	if o.Fragments {
		if l.Fragments, err = OpenFragments(Options{IfName: o.IfName}); err != nil {
			warn("no fragment socket: a fragment flood shares the link's receive path", err)
			l.Fragments = 0
		}
	}
	if l.SYN != nil || l.Fragments > 0 {
		if err := Split(l.FD, o.IfName, l.SYN != nil, l.Fragments > 0); err != nil {
			warn("the link's socket takes every frame: SYN and fragment floods share its receive path", err)
			l.closeSplit()
		}
	}
	// Frames are sent on a socket of their own so that the link's socket
	// can be read on Go's netpoller (podstack.Options.Link). Without it
	// fdbased reads the link: correct, with a thread hand-off more per
	// received batch.
	if o.Send {
		send := o.Options
		send.SendOnly = true
		if l.TX, err = Open(send); err != nil {
			warn("no send socket: the link is read by fdbased", err)
			l.TX = 0
		}
	}
	return l, nil
}

// closeSplit closes the SYN and fragment sockets, whose frames the link's
// socket keeps.
func (l *Link) closeSplit() {
	if l.SYN != nil {
		l.SYN.Close()
		l.SYN = nil
	}
	if l.Fragments > 0 {
		unix.Close(l.Fragments)
		l.Fragments = 0
	}
}

// Close closes the link's sockets, all at once: the kernel's release of a
// packet socket waits for an RCU grace period (synchronize_net; the SYN
// socket's ring a second one). One after another those waits add up to a
// large share of a DEL; at once they overlap
// (docs/performance.md). Closing twice is
// harmless.
func (l *Link) Close() {
	var wg sync.WaitGroup
	if l.SYN != nil {
		wg.Go(l.SYN.Close)
	}
	for _, fd := range []int{l.FD, l.TX, l.Fragments} {
		if fd > 0 {
			wg.Go(func() { unix.Close(fd) })
		}
	}
	wg.Wait()
	*l = Link{}
}

// LinkDrops counts the frames the kernel dropped at each of a link's
// sockets (Drops).
type LinkDrops struct {
	Link, SYN, Fragments uint64
}

// Drops reads the frames dropped at each of the link's sockets since the
// last call (Drops); a socket whose statistics cannot be read counts none.
func (l *Link) Drops() LinkDrops {
	var d LinkDrops
	read := func(fd int) uint64 {
		n, _ := Drops(fd)
		return n
	}
	d.Link = read(l.FD)
	if l.SYN != nil {
		d.SYN = read(l.SYN.FD)
	}
	if l.Fragments > 0 {
		d.Fragments = read(l.Fragments)
	}
	return d
}

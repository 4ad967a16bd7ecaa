package wirelink

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cni-usernet/cni-usernet/pkg/stack/busypoll"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"
)

// pollLoop runs the reader of one of the link's packet sockets (the
// link's socket, the SYN socket, the fragment socket) in a goroutine of
// its own, waiting on Go's network poller for the socket to become
// readable, never in a system call that holds its thread's P: with the
// stack's one P a blocked ppoll would stall the stack, and the goroutines
// a batch wakes would wait for another thread (see linkReader).
//
// The reader is serve, rc.Read's callback (one RawRead a turn, and for
// the loop's life where serve has no budget): it reads what the socket
// holds and returns false to wait for the socket to become readable, or
// true to end the wait, having set err (the socket failed) or spent (a
// turn's budget was read with frames still queued: the loop pauses, then
// serves again). A socket error ends the loop and is reported to failed,
// unless the loop was being stopped.
type pollLoop struct {
	file     *os.File // a dup of the socket, registered with the netpoller
	rc       syscall.RawConn
	stopping atomic.Bool
	done     chan struct{}
	// serve reads the socket (see above). Set before start.
	serve func(fd uintptr) bool
	// pause parks the loop after a spent turn; nil: serve never spends.
	pause func()
	// what names the reading in the error failed gets.
	what   string
	failed func(error)

	err   error // why serve ended on an error
	spent bool  // serve ended at a turn's budget
}

// open readies the loop to read fd, the named socket, through a
// duplicate on the netpoller (pollable); its errors read "<what>: <error>".
func (l *pollLoop) open(fd int, sock, what string) error {
	f, rc, err := pollable(fd, sock)
	if err != nil {
		return err
	}
	l.file, l.rc, l.done, l.what = f, rc, make(chan struct{}), what
	return nil
}

// pollable returns a duplicate of fd registered with Go's netpoller (fd
// becomes non-blocking: they share the open file). Closing the file wakes
// its reader with an error and leaves fd open.
func pollable(fd int, what string) (*os.File, syscall.RawConn, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("duplicating the %s: %w", what, err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, nil, fmt.Errorf("making the %s non-blocking: %w", what, err)
	}
	// Non-blocking, so os.NewFile registers it with the netpoller.
	f := os.NewFile(uintptr(dup), what)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return f, rc, nil
}

func (l *pollLoop) start() { go l.run() }

// stop stops the loop and waits for it. The socket itself stays open (its
// owner, packetsock.Link, closes it).
func (l *pollLoop) stop() {
	l.stopping.Store(true)
	l.file.Close()
	<-l.done
}

func (l *pollLoop) run() {
	defer close(l.done)
	for {
		l.err, l.spent = nil, false
		err := l.rc.Read(l.serve)
		if l.stopping.Load() {
			return
		}
		if err == nil && l.spent {
			l.pause()
			continue
		}
		if err == nil {
			err = l.err
		}
		// Nothing would read the socket any more: what it carries would be
		// lost while the rest kept flowing (ENETDOWN: the interface went
		// down, and the kernel unhooked the socket; nothing would arrive
		// again). podstack.Stack.Failed.
		l.failed(fmt.Errorf("%s: %w", l.what, err))
		return
	}
}

// recvLoop is a pollLoop that reads its socket's buffer with recvmmsg, in
// batches of len(msgs) frames, and hands each batch to its sink: the
// link's socket (linkReader) and the fragment socket (fragPath). The
// batch's buffers are the sink's, made once: a batch allocates nothing.
type recvLoop struct {
	pollLoop
	msgs []rawfile.MMsgHdr
	sink batchSink
	// budget is how many frames a turn reads before the loop pauses
	// (pollLoop.pause); 0: no limit, the loop reads until the socket is
	// empty.
	budget int
}

// batchSink is what a recvLoop reads for.
type batchSink interface {
	// fill points the messages' iovecs at buffers before a read: all of
	// them the first time, after that those the last batch took.
	fill()
	// deliver hands on the n frames the last read left in the messages.
	deliver(n int)
}

// readInto has the loop read into msgs for sink, budget frames a turn.
func (l *recvLoop) readInto(msgs []rawfile.MMsgHdr, sink batchSink, budget int) {
	l.msgs, l.sink, l.budget = msgs, sink, budget
	l.serve = l.serveBatches // the method value made once, not per turn
}

// serveBatches is the recvLoop's serve: it reads and delivers batches
// until the socket is empty or the budget is read. A batch that was not
// full drained the socket when it was read: whatever arrived since has
// marked the socket readable for the wait, so it waits without the
// recvmmsg that would only say EAGAIN (one system call less per received
// request).
func (l *recvLoop) serveBatches(fd uintptr) bool {
	for read := 0; l.budget == 0 || read < l.budget; {
		l.sink.fill()
		n, errno := recvmmsg(fd, l.msgs)
		switch errno {
		case 0:
		case unix.EAGAIN:
			return false
		default:
			l.err = errno
			return true
		}
		l.sink.deliver(n)
		read += n
		if n < len(l.msgs) {
			return false
		}
	}
	l.spent = true
	return true
}

// recvmmsg reads up to len(msgs) frames from fd without waiting (EAGAIN:
// none were queued). Raw, without entersyscall: MSG_DONTWAIT never
// blocks, and with the stack's one P a call that sysmon sees last a tick
// hands the P to a thread that has nothing to do (relay/rawio.go).
func recvmmsg(fd uintptr, msgs []rawfile.MMsgHdr) (int, unix.Errno) {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
		if errno != unix.EINTR {
			return int(n), errno
		}
	}
}

// linkReader reads the pod's link socket on Go's network poller and hands
// each batch to netstack in its own goroutine.
//
// fdbased's reader blocks in ppoll inside a system call that gives its P
// away (entersyscallblock). Everything the batch woke (netstack's TCP
// processor, then the relay goroutine that writes to the application)
// then waits for another OS thread to be woken to run it, a wait that
// go tool trace of a TCP_RR run shows in every request
// (docs/architecture.md, "Threads"). A goroutine parked on the netpoller
// instead leaves its thread to exactly those goroutines, so a request
// crosses the stack on the thread that read it. fdbased keeps the
// sending, on a socket of its own that receives nothing
// (packetsock.Options.SendOnly).
type linkReader struct {
	recvLoop
	mac                 tcpip.LinkAddress
	vnetHdr             bool
	rxChecksumValidated bool
	// gro delivers (or merges first, with Options.GRO) to what fdbased
	// would deliver to: the link endpoints above it.
	gro gro.GRO
	// busy hears of every batch read (nil: no busy polling).
	busy *busypoll.Poller
	// onBatch, when set, is called for every batch read (Link.OnBatch).
	onBatch atomic.Pointer[func()]

	bufs [linkReadBatch]rxBuffer
	hdrs [linkReadBatch]rawfile.MMsgHdr // recvLoop.msgs
	// refill is how many messages, from the first, the last batch filled
	// and fill has not yet given new views: the others' iovecs still
	// point at theirs.
	refill int
}

// linkReadBatch is how many frames one recvmmsg takes, as fdbased's.
const linkReadBatch = 8

// rxBufSizes shape a frame's buffer: a frame up to 2 KiB (an MTU frame,
// an ACK, a request) takes the small view, a GSO frame from the node
// (up to 64 KiB) both, and only the views a frame used are replaced after
// it. fdbased's shape (ten views, 128 B to 32 KiB, same total) had a 64
// KiB frame take ten pool chunks, ten views for netstack to clone and
// walk and ten iovecs to the application: with two, node→pod moves more
// at less CPU per byte, and TCP_RR and redis stay level
// (docs/performance.md).
var rxBufSizes = [...]int{2048, 63616}

// newRxView takes a view for frames from gVisor's pool without clearing it
// (patch 0002): recvmmsg overwrites what a frame uses, and take exposes
// only that. gVisor's NewViewSize clears the whole 64 KiB chunk for every
// frame, and more so per byte the smaller the frames: under many streams
// `memclr` is a visible share of the stack's CPU (docs/performance.md,
// "Where a request's time goes").
var newRxView = buffer.NewViewSizeUninitialized

type rxBuffer struct {
	vnet   [virtioNetHdrLen]byte // filled by the kernel, not used: see deliverFrame
	views  [len(rxBufSizes)]*buffer.View
	iovecs [len(rxBufSizes) + 1]unix.Iovec
}

func newLinkReader(fd int, vnetHdr bool) (*linkReader, error) {
	r := &linkReader{vnetHdr: vnetHdr, refill: linkReadBatch}
	if err := r.open(fd, "link socket", "reading the link"); err != nil {
		return nil, err
	}
	// No budget: the link's socket carries the pod's own traffic, which
	// the stack reads as fast as it comes (the floods have sockets of
	// their own).
	r.readInto(r.hdrs[:], r, 0)
	return r, nil
}

// close stops the reader and waits for it. The link socket itself stays
// open (its owner closes it).
func (r *linkReader) close() {
	r.stop()
	for k := range r.bufs {
		r.bufs[k].release()
	}
}

// fill gives the messages the last batch filled new views.
func (r *linkReader) fill() {
	for k := range r.refill {
		iov := r.bufs[k].iovecsFor(r.vnetHdr)
		r.hdrs[k].Msg.Iov = &iov[0]
		r.hdrs[k].Msg.SetIovlen(len(iov))
	}
	r.refill = 0
}

// deliver hands a batch of n frames to netstack and tells who listens for
// batches.
func (r *linkReader) deliver(n int) {
	for k := range n {
		r.deliverFrame(k, int(r.hdrs[k].Len))
	}
	r.gro.Flush()
	r.busy.Touch()
	if f := r.onBatch.Load(); f != nil {
		(*f)()
	}
	r.refill = n
}

// deliverFrame hands frame k of the batch, n bytes as read, to netstack,
// as fdbased would: the virtio-net header (hardware mode) is skipped, since
// checksums are trusted or verified as fdbased is told
// (rxChecksumValidated) and a GRO'd frame is taken whole; frames for
// another host's MAC are dropped.
func (r *linkReader) deliverFrame(k, n int) {
	b := &r.bufs[k]
	if r.vnetHdr {
		n -= virtioNetHdrLen
	}
	if n < header.EthernetMinimumSize {
		return
	}
	eth := header.Ethernet(b.views[0].AsSlice())
	if dst := eth.DestinationAddress(); dst != r.mac && dst[0]&1 == 0 {
		return // the views are reused as they are
	}
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: b.take(n)})
	defer pkt.DecRef()
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	pkt.NetworkProtocolNumber = eth.Type()
	pkt.RXChecksumValidated = r.rxChecksumValidated
	r.gro.Enqueue(pkt)
}

// iovecsFor points the iovecs at the buffer's views, allocating those the
// last frame took.
func (b *rxBuffer) iovecsFor(vnetHdr bool) []unix.Iovec {
	iov := b.iovecs[:0]
	if vnetHdr {
		iov = append(iov, rawfile.IovecFromBytes(b.vnet[:]))
	}
	for i, size := range rxBufSizes {
		if b.views[i] == nil {
			b.views[i] = newRxView(size)
		}
		iov = append(iov, unix.Iovec{Base: b.views[i].BasePtr()})
		iov[len(iov)-1].SetLen(size)
	}
	return iov
}

// take moves the views holding a frame of n bytes into a buffer.
func (b *rxBuffer) take(n int) buffer.Buffer {
	var out buffer.Buffer
	left := n
	for i := range b.views {
		if left <= 0 {
			break
		}
		v := b.views[i]
		b.views[i] = nil
		if v.Size() > left {
			v.CapLength(left)
		}
		left -= v.Size()
		out.Append(v)
	}
	return out
}

// release frees the views (on close).
func (b *rxBuffer) release() {
	for i, v := range b.views {
		if v != nil {
			v.Release()
			b.views[i] = nil
		}
	}
}

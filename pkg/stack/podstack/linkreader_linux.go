package podstack

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
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"
)

// linkReader reads the pod's link socket on Go's network poller and hands
// each batch to netstack in its own goroutine.
//
// fdbased's reader blocks in ppoll inside a system call that gives its P
// away (entersyscallblock). Everything the batch woke (netstack's TCP
// processor, then the relay goroutine that writes to the application)
// then waits for another OS thread to be woken to run it: 25-60 µs per
// request on this kind of VM (go tool trace of a TCP_RR run, the stack's
// /debug/pprof/trace). A goroutine parked on the netpoller instead leaves
// its thread to exactly those goroutines, so a request crosses the stack
// on the thread that read it. fdbased keeps the sending, on a socket of
// its own that receives nothing (packetsock.Options.SendOnly).
type linkReader struct {
	file                *os.File // a dup of the link socket, registered with the netpoller
	rc                  syscall.RawConn
	mac                 tcpip.LinkAddress
	vnetHdr             bool
	rxChecksumValidated bool
	// gro delivers (or merges first, with Options.GRO) to what fdbased
	// would deliver to: the link endpoints above it.
	gro      gro.GRO
	failed   func(error)
	done     chan struct{}
	stopping atomic.Bool
	// busy hears of every batch read (nil: no busy polling).
	busy *busypoll.Poller
	// onBatch, when set, is called for every batch read (Stack.OnLinkBatch).
	onBatch atomic.Pointer[func()]

	bufs [linkReadBatch]rxBuffer
	msgs [linkReadBatch]rawfile.MMsgHdr
	err  unix.Errno // why serve ended
	// refill is how many messages, from the first, the last batch filled
	// and serve has not yet given new views: the others' iovecs still
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
// walk and ten iovecs to the application: with two, node→pod moved
// 9.8–11.2 against 8.6–10.0 Gbit/s at 0.62–0.73 against 0.73–0.86
// core·s per GB, TCP_RR and redis level (lab, alternated;
// docs/benchmarks/2026-12-01-relay-writev-gro.md).
var rxBufSizes = [...]int{2048, 63616}

// newRxView takes a view for frames from gVisor's pool without clearing it
// (patch 0002): recvmmsg overwrites what a frame uses, and take exposes
// only that. gVisor's NewViewSize clears the whole 64 KiB chunk for every
// frame, and more so per byte the smaller the frames: `memclr` was 7 % of
// the stack's CPU under 128 streams (docs/performance.md).
var newRxView = buffer.NewViewSizeUninitialized

type rxBuffer struct {
	vnet   [virtioNetHdrLen]byte // filled by the kernel, not used: see deliver
	views  [len(rxBufSizes)]*buffer.View
	iovecs [len(rxBufSizes) + 1]unix.Iovec
}

func newLinkReader(fd int, vnetHdr bool) (*linkReader, error) {
	f, rc, err := pollable(fd, "link socket")
	if err != nil {
		return nil, err
	}
	return &linkReader{file: f, rc: rc, vnetHdr: vnetHdr, done: make(chan struct{}), refill: linkReadBatch}, nil
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

func (r *linkReader) start() { go r.run() }

// close stops the reader and waits for it. The link socket itself stays
// open (its owner closes it).
func (r *linkReader) close() {
	r.stopping.Store(true)
	r.file.Close()
	<-r.done
	for k := range r.bufs {
		r.bufs[k].release()
	}
}

func (r *linkReader) run() {
	defer close(r.done)
	// One RawRead for the reader's life: serve returns only on a socket
	// error, and waits for readability by returning false.
	err := r.rc.Read(r.serve)
	switch {
	case err != nil && r.stopping.Load():
	case err != nil:
		r.failed(fmt.Errorf("reading the link: %w", err))
	default:
		// ENETDOWN: the interface went down, and the kernel unhooked the
		// socket; nothing would arrive again (Stack.Failed).
		r.failed(fmt.Errorf("reading the link: %w", r.err))
	}
}

// serve is rc.Read's callback: it reads and delivers batches until the
// socket is empty, then returns false to wait for it to become readable,
// or true on an error (r.err). A batch that was not full drained the
// socket when it was read: whatever arrived since has marked the socket
// readable for the wait, so serve waits without the recvmmsg that would
// only say EAGAIN (one system call less per received request).
func (r *linkReader) serve(fd uintptr) bool {
	for {
		for k := range r.refill {
			iov := r.bufs[k].iovecsFor(r.vnetHdr)
			r.msgs[k].Msg.Iov = &iov[0]
			r.msgs[k].Msg.SetIovlen(len(iov))
		}
		r.refill = 0
		// Raw, without entersyscall: MSG_DONTWAIT never blocks, and with
		// the stack's one P a call that sysmon sees last a tick hands the
		// P to a thread that has nothing to do (relay/rawio.go).
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(len(r.msgs)), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			r.err = errno
			return true
		}
		for k := range int(n) {
			r.deliver(k, int(r.msgs[k].Len))
		}
		r.gro.Flush()
		r.busy.Touch()
		if f := r.onBatch.Load(); f != nil {
			(*f)()
		}
		r.refill = int(n)
		if r.refill < len(r.msgs) {
			return false
		}
	}
}

// deliver hands frame k of the batch, n bytes as read, to netstack, as
// fdbased would: the virtio-net header (hardware mode) is skipped, since
// checksums are trusted or verified as fdbased is told
// (rxChecksumValidated) and a GRO'd frame is taken whole; frames for
// another host's MAC are dropped.
func (r *linkReader) deliver(k, n int) {
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
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: b.take(n)})
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

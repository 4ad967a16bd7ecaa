package podstack

import (
	"sync/atomic"

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
	recvLoop
	mac                 tcpip.LinkAddress
	vnetHdr             bool
	rxChecksumValidated bool
	// gro delivers (or merges first, with Options.GRO) to what fdbased
	// would deliver to: the link endpoints above it.
	gro gro.GRO
	// busy hears of every batch read (nil: no busy polling).
	busy *busypoll.Poller
	// onBatch, when set, is called for every batch read (Stack.OnLinkBatch).
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
// walk and ten iovecs to the application: with two, node→pod moved
// 9.8–11.2 against 8.6–10.0 Gbit/s at 0.62–0.73 against 0.73–0.86
// core·s per GB, TCP_RR and redis level (lab, alternated; BENCHMARKS.md,
// History: relay writes from netstack's buffers, GRO rows).
var rxBufSizes = [...]int{2048, 63616}

// newRxView takes a view for frames from gVisor's pool without clearing it
// (patch 0002): recvmmsg overwrites what a frame uses, and take exposes
// only that. gVisor's NewViewSize clears the whole 64 KiB chunk for every
// frame, and more so per byte the smaller the frames: `memclr` was 7 % of
// the stack's CPU under 128 streams (docs/performance.md).
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

package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
)

// Options configures a capture run of one pod.
type Options struct {
	// ControlSocket is the pod stack's control socket. Required with
	// Wire.
	ControlSocket string
	// Netns is a path to the pod's network namespace (the stack's
	// /proc/PID/ns/net). Required.
	Netns string
	// Wire and App choose the legs; at least one.
	Wire, App bool
	// WireDevice is the pod's interface the stack owns ("eth0");
	// AppDevices the app leg's devices ("lo" and the TUN).
	WireDevice string
	AppDevices []string
	// PodIPs are the pod's addresses: loopback packets between them and
	// loopback are the pod's own, not the relay's.
	PodIPs []netip.Addr
	// Count stops the capture after that many packets; zero: no limit.
	Count int
	// Duration stops the capture after that long; zero: no limit.
	Duration time.Duration
	// SnapLen is the most of a packet kept. Zero: DefaultSnapLen.
	SnapLen int
	// Out receives the pcapng stream. Required.
	Out io.Writer
	// Started, when set, is called once every leg is being captured,
	// with the output's interfaces.
	Started func([]pcap.Interface)
}

// Validate reports the first problem with o.
func (o *Options) Validate() error {
	switch {
	case !o.Wire && !o.App:
		return fmt.Errorf("no leg to capture")
	case o.Wire && (o.ControlSocket == "" || o.WireDevice == ""):
		return fmt.Errorf("the wire leg needs the control socket and the device")
	case o.App && len(o.AppDevices) == 0:
		return fmt.Errorf("the app leg needs its devices")
	case o.Netns == "":
		return fmt.Errorf("no network namespace")
	case o.Out == nil:
		return fmt.Errorf("no output")
	case o.SnapLen != 0 && (o.SnapLen <= pcap.SLL2HeaderLen || o.SnapLen > pcap.DefaultSnapLen):
		return fmt.Errorf("snap length %d: want %d..%d", o.SnapLen, pcap.SLL2HeaderLen+1, pcap.DefaultSnapLen)
	case o.Count < 0 || o.Duration < 0:
		return fmt.Errorf("negative count or duration")
	}
	return nil
}

// IfaceSummary is what happened on one of the output's interfaces.
type IfaceSummary struct {
	Name, Leg string
	// Written counts packets in the output.
	Written uint64
	// Dropped counts packets lost because the reader was behind, and
	// DroppedWhere says how many were dropped where.
	Dropped      uint64
	DroppedWhere string
}

// Summary is what a run did.
type Summary struct {
	Ifaces []IfaceSummary
	// Incomplete, when set, says why the counts may be short (the wire
	// stream ended without the stack's counts).
	Incomplete string
	// CountReached is true when the run stopped at Options.Count.
	CountReached bool
}

// Written is the packets in the output.
func (s Summary) Written() uint64 {
	var n uint64
	for _, i := range s.Ifaces {
		n += i.Written
	}
	return n
}

// Dropped is the packets lost for a slow reader.
func (s Summary) Dropped() uint64 {
	var n uint64
	for _, i := range s.Ifaces {
		n += i.Dropped
	}
	return n
}

// reorderDelay is how long a packet waits for older ones from the other
// leg (the wire leg comes through the stack and the control socket, the
// app leg straight from the kernel), so that the output reads in time
// order: a relayed SYN after the one that caused it.
const reorderDelay = 150 * time.Millisecond

// maxPendingBytes bounds the packets held for reordering.
const maxPendingBytes = 16 << 20

// stopGrace bounds how long the end of a capture waits for the stack to
// send what it still holds and its counts.
const stopGrace = 5 * time.Second

type ifaceState struct {
	IfaceSummary
	// late counts packets that arrived after the capture had stopped
	// and found the merge full.
	late atomic.Uint64
}

// Record captures until ctx ends, Count or Duration is reached, or the output
// fails (a reader that went away), and writes pcapng to o.Out.
func Record(ctx context.Context, o Options) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, fmt.Errorf("capture options: %w", err)
	}
	if o.SnapLen == 0 {
		o.SnapLen = pcap.DefaultSnapLen
	}
	l, err := openLegs(o)
	if err != nil {
		return Summary{}, err
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Duration > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeout(ctx, o.Duration)
		defer cancelT()
	}
	in := l.read(ctx, cancel, o.SnapLen)
	if o.Started != nil {
		o.Started(l.ifaces)
	}
	sum, werr := merge(in, o, l.ifaces, l.states, cancel, l.settle)
	if l.wire != nil && !l.wire.complete {
		sum.Incomplete = "the stack ended the stream without its counts (stopped or restarted?)"
	}
	for _, st := range l.states {
		sum.Ifaces = append(sum.Ifaces, st.IfaceSummary)
	}
	if werr != nil {
		return sum, werr
	}
	// in is closed: the wire leg's reader is done with wireErr.
	if l.wireErr != nil {
		return sum, l.wireErr
	}
	return sum, nil
}

// legs owns what a capture reads from: the app leg's packet sockets and
// the wire leg's stream, with the output's interface for each. Close
// releases them all.
type legs struct {
	ifaces []pcap.Interface
	states []*ifaceState
	socks  []*packetSocket
	// sockIface is the output's interface of each socket.
	sockIface []int
	wire      *wireStream
	// wireErr is why the wire leg ended early; set before read's channel
	// closes.
	wireErr error
}

// openLegs opens the sockets of the app leg and the stream of the wire
// leg; on failure nothing stays open.
func openLegs(o Options) (_ *legs, err error) {
	var devs []Device
	if o.App {
		for _, d := range o.AppDevices {
			dev := Device{Name: d}
			if d == "lo" {
				f, err := LoopbackFilter(o.PodIPs)
				if err != nil {
					return nil, err
				}
				dev.Filter = f
			}
			devs = append(devs, dev)
		}
	}
	names := append([]string{}, o.AppDevices...)
	if o.Wire {
		names = append(names, o.WireDevice)
	}
	l := &legs{}
	var ifIndex map[string]int
	if l.socks, ifIndex, err = openInNetns(o.Netns, devs, names); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	addIface := func(name, leg, desc string) int {
		l.ifaces = append(l.ifaces, pcap.Interface{Name: name, Leg: leg, IfIndex: ifIndex[name], Description: desc, SnapLen: o.SnapLen})
		l.states = append(l.states, &ifaceState{IfaceSummary: IfaceSummary{Name: name, Leg: leg}})
		return len(l.ifaces) - 1
	}
	if o.Wire {
		i := addIface(o.WireDevice, "wire", "wire leg: the pod's link as the cni-usernet stack sees it")
		if l.wire, err = openWire(o.ControlSocket, o.SnapLen, i, uint32(ifIndex[o.WireDevice])); err != nil {
			return nil, err
		}
	}
	l.sockIface = make([]int, len(l.socks))
	for k := range l.socks {
		l.sockIface[k] = addIface(o.AppDevices[k], "app", "app leg: the pod's kernel, between the stack and the applications")
	}
	return l, nil
}

// Close releases the sockets and the stream.
func (l *legs) Close() {
	for _, s := range l.socks {
		s.close()
	}
	if l.wire != nil {
		l.wire.cancel()
		l.wire.body.Close()
	}
}

// read starts a reader per leg and returns the channel of their packets,
// closed once every reader is done. The wire leg ending before ctx calls
// stop: a capture of half the pod is not what was asked for.
func (l *legs) read(ctx context.Context, stop context.CancelFunc, snapLen int) <-chan pcap.Packet {
	in := make(chan pcap.Packet, 4096)
	push := func(p pcap.Packet) {
		select {
		case in <- p:
			return
		default:
		}
		select {
		case in <- p:
		case <-ctx.Done():
			// Stopping, and the merge is full: not waited for.
			l.states[p.Iface].late.Add(1)
		}
	}
	var wg sync.WaitGroup
	if l.wire != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.wireErr = l.wire.run(ctx, push)
			// The stream ends before the capture only when the stack
			// went away.
			if ctx.Err() == nil {
				if l.wireErr == nil {
					l.wireErr = errors.New("the stack ended the capture stream (stopped or restarted)")
				}
				stop()
			}
		}()
	}
	for k, s := range l.socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readSocket(ctx, s, l.sockIface[k], snapLen, push)
		}()
	}
	go func() {
		wg.Wait()
		close(in)
	}()
	return in
}

// settle counts the drops once every source is done: the stack's came
// with its trailer, the kernel's are read from the sockets.
func (l *legs) settle(countReached bool) {
	drop := func(st *ifaceState, n uint64, where string) {
		if n == 0 {
			return
		}
		if st.DroppedWhere != "" {
			st.DroppedWhere += ", "
		}
		st.Dropped += n
		st.DroppedWhere += fmt.Sprintf("%d %s", n, where)
	}
	if l.wire != nil {
		drop(l.states[l.wire.iface], l.wire.dropped, "in the stack (its queue for this capture was full)")
	}
	for k, s := range l.socks {
		s.stats()
		drop(l.states[l.sockIface[k]], s.dropped, "by the pod's kernel (the capture's socket buffer was full)")
	}
	// Past the count, the rest is not wanted: not a drop.
	if !countReached {
		for _, st := range l.states {
			drop(st, st.late.Load(), "by cni-usernet capture (stopped while the output was behind)")
		}
	}
}

func readSocket(ctx context.Context, s *packetSocket, iface, snapLen int, push func(pcap.Packet)) {
	buf := make([]byte, 256<<10)
	oob := make([]byte, 128)
	for ctx.Err() == nil {
		p, err := s.read(buf, oob, snapLen)
		if errors.Is(err, errReadTimeout) {
			continue
		}
		if err != nil {
			return
		}
		p.Iface = iface
		push(p)
	}
}

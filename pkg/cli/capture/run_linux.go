package capture

import (
	"bufio"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
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

// Run captures until ctx ends, Count or Duration is reached, or the output
// fails (a reader that went away), and writes pcapng to o.Out.
func Run(ctx context.Context, o Options) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, fmt.Errorf("capture options: %w", err)
	}
	if o.SnapLen == 0 {
		o.SnapLen = pcap.DefaultSnapLen
	}
	var devs []Device
	if o.App {
		for _, d := range o.AppDevices {
			dev := Device{Name: d}
			if d == "lo" {
				f, err := LoopbackFilter(o.PodIPs)
				if err != nil {
					return Summary{}, err
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
	socks, ifIndex, err := openInNetns(o.Netns, devs, names)
	if err != nil {
		return Summary{}, err
	}
	defer func() {
		for _, s := range socks {
			s.close()
		}
	}()

	var ifaces []pcap.Interface
	var states []*ifaceState
	addIface := func(name, leg, desc string) int {
		ifaces = append(ifaces, pcap.Interface{Name: name, Leg: leg, IfIndex: ifIndex[name], Description: desc, SnapLen: o.SnapLen})
		states = append(states, &ifaceState{IfaceSummary: IfaceSummary{Name: name, Leg: leg}})
		return len(ifaces) - 1
	}
	var wire *wireStream
	if o.Wire {
		i := addIface(o.WireDevice, "wire", "wire leg: the pod's link as the cni-usernet stack sees it")
		if wire, err = openWire(o.ControlSocket, o.SnapLen, i, uint32(ifIndex[o.WireDevice])); err != nil {
			return Summary{}, err
		}
		defer wire.body.Close()
	}
	sockIface := make([]int, len(socks))
	for k := range socks {
		sockIface[k] = addIface(o.AppDevices[k], "app", "app leg: the pod's kernel, between the stack and the applications")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Duration > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeout(ctx, o.Duration)
		defer cancelT()
	}
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
			states[p.Iface].late.Add(1)
		}
	}
	var wg sync.WaitGroup
	var wireErr error
	if wire != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wireErr = wire.run(ctx, push)
			// The stream ends before the capture only when the stack
			// went away: a capture of half the pod is not what was
			// asked for.
			if ctx.Err() == nil {
				if wireErr == nil {
					wireErr = errors.New("the stack ended the capture stream (stopped or restarted)")
				}
				cancel()
			}
		}()
	}
	for k, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readSocket(ctx, s, sockIface[k], o.SnapLen, push)
		}()
	}
	go func() {
		wg.Wait()
		close(in)
	}()
	if o.Started != nil {
		o.Started(ifaces)
	}

	// Once every source is done: the stack's counts came with its
	// trailer, the kernel's are read from the sockets.
	settle := func(countReached bool) {
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
		if wire != nil {
			drop(states[wire.iface], wire.dropped, "in the stack (its queue for this capture was full)")
		}
		for k, s := range socks {
			s.stats()
			drop(states[sockIface[k]], s.dropped, "by the pod's kernel (the capture's socket buffer was full)")
		}
		// Past the count, the rest is not wanted: not a drop.
		if !countReached {
			for _, st := range states {
				drop(st, st.late.Load(), "by cni-usernet capture (stopped while the output was behind)")
			}
		}
	}
	sum, werr := merge(in, o, ifaces, states, cancel, settle)
	if wire != nil && !wire.complete {
		sum.Incomplete = "the stack ended the stream without its counts (stopped or restarted?)"
	}
	for _, st := range states {
		sum.Ifaces = append(sum.Ifaces, st.IfaceSummary)
	}
	if werr != nil {
		return sum, werr
	}
	if wireErr != nil {
		return sum, wireErr
	}
	return sum, nil
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

// merge writes the packets in time order (within reorderDelay) until in
// closes; it calls stop when the count is reached or the output fails.
func merge(in <-chan pcap.Packet, o Options, ifaces []pcap.Interface, states []*ifaceState, stop func(), settle func(countReached bool)) (Summary, error) {
	var sum Summary
	bw := bufio.NewWriterSize(o.Out, 256<<10)
	pw, err := pcap.NewPcapngWriter(bw, ifaces)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		stop()
		for range in {
		}
		settle(false)
		return sum, fmt.Errorf("writing the capture: %w", err)
	}
	var pending packetHeap
	var written int
	var outErr error
	// emit writes the pending packets older than before (all if zero)
	// and returns their bytes.
	emit := func(before time.Time) (n int) {
		for len(pending) > 0 && (before.IsZero() || pending[0].Time.Before(before)) {
			p := heap.Pop(&pending).(pcap.Packet)
			n += len(p.Frame)
			if outErr != nil || (o.Count > 0 && written >= o.Count) {
				continue
			}
			if outErr = pw.WritePacket(&p); outErr != nil {
				stop()
				continue
			}
			written++
			states[p.Iface].Written++
			if o.Count > 0 && written == o.Count {
				sum.CountReached = true
				stop()
			}
		}
		return n
	}
	tick := time.NewTicker(reorderDelay / 3)
	defer tick.Stop()
	var pendingBytes int
	for open := true; open; {
		select {
		case p, ok := <-in:
			if !ok {
				open = false
				continue
			}
			heap.Push(&pending, p)
			pendingBytes += len(p.Frame)
			if pendingBytes < maxPendingBytes {
				continue
			}
			// A burst beyond what the reorder window may hold: write
			// the oldest now, in order as far as the window went.
			for pendingBytes >= maxPendingBytes/2 && len(pending) > 0 {
				pendingBytes -= emit(pending[0].Time.Add(1))
			}
		case <-tick.C:
			pendingBytes -= emit(time.Now().Add(-reorderDelay))
		}
		if outErr == nil && len(in) == 0 {
			if outErr = bw.Flush(); outErr != nil {
				stop()
			}
		}
	}
	emit(time.Time{})
	settle(sum.CountReached)
	if outErr == nil {
		now := time.Now()
		for i, st := range states {
			if outErr = pw.WriteStats(i, now, st.Written, st.Dropped); outErr != nil {
				break
			}
		}
	}
	if outErr == nil {
		outErr = bw.Flush()
	}
	// A reader that went away (tcpdump -c exited) ends the capture; it
	// is not a failure.
	if outErr != nil && !errors.Is(outErr, syscall.EPIPE) {
		return sum, fmt.Errorf("writing the capture: %w", outErr)
	}
	return sum, nil
}

type packetHeap []pcap.Packet

func (h packetHeap) Len() int           { return len(h) }
func (h packetHeap) Less(i, j int) bool { return h[i].Time.Before(h[j].Time) }
func (h packetHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)        { *h = append(*h, x.(pcap.Packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}

// wireStream is the stack's stream of the wire leg.
type wireStream struct {
	client  *http.Client
	body    io.ReadCloser
	resp    *http.Response
	id      string
	iface   int
	ifIndex uint32
	cancel  context.CancelFunc
	// Set when the stream ended with the stack's counts.
	complete bool
	sent     uint64
	dropped  uint64
}

func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

func openWire(sock string, snapLen, iface int, ifIndex uint32) (*wireStream, error) {
	w := &wireStream{client: unixClient(sock), iface: iface, ifIndex: ifIndex}
	// The stream outlives the capture's context by stopGrace: it ends
	// when the stack has sent what it holds.
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://stack"+pcap.StreamPath+"?"+pcap.SnapLenQuery+"="+strconv.Itoa(snapLen), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("asking the stack at %s for a capture: %w", sock, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusNotFound {
			// Stacks outlive agents: after an upgrade, a pod's stack can
			// still be one an earlier release started, before stacks had
			// a capture stream.
			return nil, fmt.Errorf("the stack at %s has no capture stream (%s): it runs an earlier release of cni-usernet, started before the upgrade; "+
				"when its process ends, the agent starts it again from the installed release, which can be captured", sock, pcap.StreamPath)
		}
		return nil, fmt.Errorf("the stack at %s refused the capture: %s: %s", sock, resp.Status, msg)
	}
	w.resp, w.body, w.id, w.cancel = resp, resp.Body, resp.Header.Get(pcap.HeaderID), cancel
	return w, nil
}

// run reads the stream until it ends; when ctx ends it asks the stack to
// stop and reads on until the stack's counts arrive.
func (w *wireStream) run(ctx context.Context, push func(pcap.Packet)) error {
	defer w.cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		req, _ := http.NewRequest(http.MethodPost, "http://stack"+pcap.StopPath+"?"+pcap.SessionIDForm+"="+w.id, nil)
		c := *w.client
		c.Timeout = stopGrace
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
		select {
		case <-done:
		case <-time.After(stopGrace):
			w.cancel()
		}
	}()
	pr, err := pcap.NewPcapReader(w.body)
	if err != nil {
		return fmt.Errorf("reading the stack's capture stream: %w", err)
	}
	for {
		p, err := pr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the stack's capture stream broke off (the stack stopped or restarted?): %w", err)
		}
		pcap.SetIfIndex(p.Frame, w.ifIndex)
		p.Iface = w.iface
		push(p)
	}
	sent, err1 := strconv.ParseUint(w.resp.Trailer.Get(pcap.TrailerSent), 10, 64)
	dropped, err2 := strconv.ParseUint(w.resp.Trailer.Get(pcap.TrailerDrops), 10, 64)
	if err1 == nil && err2 == nil {
		w.complete, w.sent, w.dropped = true, sent, dropped
	}
	return nil
}

package podstack

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
)

// reassemblyLimit is netstack's fragmentation.HighFragThreshold: what its
// reassembly counts before it evicts.
const reassemblyLimit = 4 << 20

// TestFragmentFloodHeldAsCounted floods a stack on a veth with first
// fragments that never complete, each from its own source (the smallest
// there are: a UDP header), far more than netstack's 4 MiB reassembly
// limit admits, and checks that the heap they leave live is within twice
// 3.5 times that limit. netstack counts a fragment's length plus one
// PacketBuffer (42 + 328 bytes here) and evicts down to 3 MiB beyond 4;
// what it does not count is about as much again for a first fragment (a
// second PacketBuffer, the reassembler, its holes and map entry), which
// the reassembly charge in front of each copy makes it count. Without the
// copy of each fragment into a buffer of its own size, each would also
// hold the link reader's 2 KiB view, far beyond the bound
// (docs/reliability/hostile.md, "Fragments at full speed", holds what
// each way leaves live). Then a fragmented echo request still reassembles
// and is answered. Both ways a fragment arrives: on the link's socket, and
// on a fragment socket of its own (fragPath).
func TestFragmentFloodHeldAsCounted(t *testing.T) {
	for _, fragSocket := range []bool{false, true} {
		t.Run(map[bool]string{false: "link socket", true: "fragment socket"}[fragSocket], func(t *testing.T) {
			testFragmentFloodHeldAsCounted(t, fragSocket)
		})
	}
}

func testFragmentFloodHeldAsCounted(t *testing.T, fragSocket bool) {
	s, _, peer := newReaderStack(t, offload.ModeHardware, fragSocket)
	const want = 40_000 // ~3.5 times what 4 MiB admits at 370 bytes each
	heap0 := liveHeap()
	rng := rand.New(rand.NewPCG(29, 29))
	for sent := 0; s.WireStats.Snapshot().RxFragments < want; {
		// Bursts the socket's receive buffer holds, then wait for the
		// stack to read them.
		for range 256 {
			if _, err := unix.Write(peer, floodFragment(rng)); err != nil {
				t.Fatalf("sending fragment %d: %v", sent, err)
			}
			sent++
		}
		for deadline := time.Now().Add(time.Second); s.WireStats.Snapshot().RxFragments+64 < uint64(sent) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if sent > 4*want {
			t.Fatalf("sent %d fragments, the stack counted %d", sent, s.WireStats.Snapshot().RxFragments)
		}
	}
	grew := int64(liveHeap()) - int64(heap0)
	t.Logf("%d fragments received; live heap grew by %.1f MiB (netstack's reassembly counts up to %d MiB)",
		s.WireStats.Snapshot().RxFragments, float64(grew)/(1<<20), reassemblyLimit>>20)
	if limit := int64(7 * reassemblyLimit / 2); grew > limit {
		t.Errorf("live heap after the fragment flood grew by %.1f MiB, want <= %.1f MiB", float64(grew)/(1<<20), float64(limit)/(1<<20))
	}
	// Every fragment came by the path under test.
	if shared, all := s.WireStats.Snapshot().RxFragmentsShared, s.WireStats.Snapshot().RxFragments; fragSocket && shared != 0 || !fragSocket && shared != all {
		t.Errorf("%d of %d fragments came through the link's socket, want %d", shared, all, map[bool]uint64{false: all, true: 0}[fragSocket])
	}
	if until := s.ReassemblyHeldUntil(); time.Until(until) < ipv4.ReassembleTimeout-5*time.Second || time.Until(until) > ipv4.ReassembleTimeout {
		t.Errorf("ReassemblyHeldUntil() is %s from now, want about %s", time.Until(until).Round(time.Second), ipv4.ReassembleTimeout)
	}

	// A datagram in two fragments (the probe's echo request, split after
	// its ICMP header) still reassembles and is answered. (peer's receive
	// buffer is full of the flood it sent: emptied first.)
	for buf := make([]byte, 2048); ; {
		if _, _, err := unix.Recvfrom(peer, buf, unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	icmp := make([]byte, header.ICMPv4MinimumSize+len(probeData))
	h := header.ICMPv4(icmp)
	h.SetType(header.ICMPv4Echo)
	h.SetIdent(probeID)
	h.SetSequence(29)
	copy(h.Payload(), probeData)
	h.SetChecksum(^checksum.Checksum(icmp, 0))
	for _, part := range []struct {
		flags uint8
		off   uint16
		data  []byte
	}{{header.IPv4FlagMoreFragments, 0, icmp[:8]}, {0, 8, icmp[8:]}} {
		f := fuzzFrame(0, part.flags, part.off, part.data)
		ip := header.IPv4(f[header.EthernetMinimumSize:])
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(ip)), ID: 2929, Flags: part.flags, FragmentOffset: part.off, TTL: 64,
			Protocol: uint8(header.ICMPv4ProtocolNumber), SrcAddr: tcpip.AddrFrom4(fuzzGw.As4()), DstAddr: tcpip.AddrFrom4(fuzzPodIP.As4())})
		ip.SetChecksum(^ip.CalculateChecksum())
		if _, err := unix.Write(peer, f); err != nil {
			t.Fatalf("sending the echo request's fragment at %d: %v", part.off, err)
		}
	}
	if !awaitReply(peer, 29) {
		t.Errorf("no echo reply to a request in two fragments within 2s")
	}
}

// floodFragment is a first fragment that never completes (a UDP header),
// from a random source and with a random ID: each one opens a reassembly
// of its own.
func floodFragment(rng *rand.Rand) []byte {
	src := [4]byte{198, 18 + byte(rng.IntN(2)), byte(rng.IntN(256)), byte(rng.IntN(256))}
	f := fuzzFrame(header.UDPProtocolNumber, header.IPv4FlagMoreFragments, 0, make([]byte, header.UDPMinimumSize))
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	ip.SetSourceAddress(tcpip.AddrFrom4(src))
	ip.SetID(uint16(rng.Uint32()))
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	return f
}

// TestFragmentsQueueApart: an echo request sent behind a burst of
// fragments is answered while the fragments queued ahead of it are still
// being read, on the stack's one P as in its process. Through one socket
// that cannot happen (its queue is first in, first out: the request is
// read after every fragment before it), so this holds exactly when the
// fragments queue apart from the other frames and the fragment path gives
// the thread up within its budget.
func TestFragmentsQueueApart(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s, _, peer := newReaderStack(t, offload.ModeHardware, true)
	// Until the kernel's link watch has activated the peer's queueing
	// discipline (up to a second after the link came up) what the peer
	// sends is dropped: the stack answers once it is.
	answered := false
	for seq := uint16(100); seq < 105 && !answered; seq++ {
		_, answered = pingOnce(t, peer, fuzzMAC, seq)
	}
	if !answered {
		t.Fatal("no echo reply before the fragments, five requests in 10 s")
	}
	// Fewer than the fragment socket's buffer holds (about 1,300 bytes of
	// it each), so that none is dropped: each is read after the request.
	const burst = 1000
	rng := rand.New(rand.NewPCG(29, 30))
	frags := make([][]byte, burst)
	for i := range frags {
		frags[i] = floodFragment(rng)
	}
	before := s.WireStats.Snapshot().RxFragments
	for i, f := range frags {
		if _, err := unix.Write(peer, f); err != nil {
			t.Fatalf("sending fragment %d: %v", i, err)
		}
	}
	_, ok := pingOnce(t, peer, fuzzMAC, 2)
	atReply := s.WireStats.Snapshot().RxFragments - before
	if !ok {
		t.Fatal("no echo reply behind the fragments within 2s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.WireStats.Snapshot().RxFragments-before < burst && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	all := s.WireStats.Snapshot().RxFragments - before
	turns := s.WireStats.Snapshot().FragmentTurns
	t.Logf("echo reply after %d of the %d fragments sent before it had been read (%d read in all, the fragment path yielded %d times)", atReply, burst, all, turns)
	if all != burst {
		t.Errorf("the stack read %d of the %d fragments, want all", all, burst)
	}
	if atReply >= all {
		t.Errorf("the echo request was answered after all %d fragments queued before it had been read: it queued behind them", all)
	}
	if turns == 0 {
		t.Error("the fragment path read a burst of 1,000 fragments without yielding at its budget")
	}
}

// awaitReply waits up to 2s for the echo reply with sequence seq on peer.
func awaitReply(peer int, seq uint16) bool {
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		fds := []unix.PollFd{{Fd: int32(peer), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			continue
		}
		n, err := unix.Read(peer, buf)
		if err != nil {
			continue
		}
		if got, ok := probeReply(buf[:n]); ok && got == seq {
			return true
		}
	}
	return false
}

// liveHeap is the heap's live bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

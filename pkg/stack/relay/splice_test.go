package relay

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/loopback"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// spliceRig is one relayed connection without the rest of the stack: a
// netstack on a loopback link where peer (the network's side) is
// connected to wire (the wire leg's end), and a kernel TCP pair over
// 127.0.0.1 where app (the application) is connected to pod (the relay's
// socket in the pod's kernel).
type spliceRig struct {
	r    *tcpRelay
	s    *tcpipstack.Stack
	wire *wireConn
	peer *gonet.TCPConn
	pod  podConn
	app  *net.TCPConn
}

func newSpliceRig(t *testing.T) *spliceRig {
	t.Helper()
	s := tcpipstack.New(tcpipstack.Options{
		NetworkProtocols:   []tcpipstack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []tcpipstack.TransportProtocolFactory{tcp.NewProtocol},
	})
	t.Cleanup(func() { s.Close(); s.Wait() })
	if err := s.CreateNIC(1, loopback.New()); err != nil {
		t.Fatal(err)
	}
	addr := tcpip.AddrFrom4([4]byte{10, 0, 0, 1})
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: addr.WithPrefix()}, tcpipstack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}})

	wire, peer := connectWire(t, s, 80)

	pod, app := tcpPair(t)
	return &spliceRig{
		r:    &tcpRelay{env: &env{opts: Options{CopyBufferBytes: 256 << 10}}},
		s:    s,
		wire: wire,
		peer: peer,
		pod:  podConn{pod},
		app:  app,
	}
}

func pattern(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// writeChunks writes b in pieces of random size, as applications do.
func writeChunks(w io.Writer, b []byte, seed int64) error {
	rng := rand.New(rand.NewSource(seed))
	for len(b) > 0 {
		n := min(len(b), 1+rng.Intn(100<<10))
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readSlowly reads everything in small reads with pauses, so that the
// writer keeps finding the socket full and writes only part of what it
// has.
func readSlowly(r io.Reader) ([]byte, error) {
	var out bytes.Buffer
	buf := make([]byte, 8<<10)
	for i := 0; ; i++ {
		n, err := r.Read(buf)
		out.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return out.Bytes(), nil
		}
		if err != nil {
			return out.Bytes(), err
		}
		if i%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// TestWireToPodDeliversExactBytes: data from the network reaches the
// application byte for byte although it is written straight from
// netstack's buffers, in part writes into a small socket buffer, and the
// peer's FIN ends the direction cleanly.
func TestWireToPodDeliversExactBytes(t *testing.T) {
	rig := newSpliceRig(t)
	rig.pod.SetWriteBuffer(64 << 10) // partial writes: the socket is often full
	relayExactly(t, pattern(16<<20, 1), rig.peer, rig.app,
		func() error { return rig.r.wireToPod(rig.wire, rig.pod) }, rig.pod.CloseWrite, rig.r.stats.ToAppBytes.Load)
}

// TestPodToWireDeliversExactBytes: what the application writes reaches
// the network byte for byte, against a slow reader that keeps netstack's
// send buffer full, and the application's FIN ends the direction cleanly.
func TestPodToWireDeliversExactBytes(t *testing.T) {
	rig := newSpliceRig(t)
	relayExactly(t, pattern(16<<20, 3), rig.app, rig.peer,
		func() error { return rig.r.podToWire(rig.pod, rig.wire) }, rig.wire.CloseWrite, rig.r.stats.FromAppBytes.Load)
}

// halfConn is a connection end a test writes to or reads from.
type halfConn interface {
	io.ReadWriter
	CloseWrite() error
	SetReadDeadline(time.Time) error
}

// relayExactly writes want to src in pieces and half-closes it while relay
// runs (closeWrite passing its end on), and reads dst slowly to its end. It
// fails unless dst got exactly want, relay returned nil at the FIN, and
// counted (the relay's byte counter) saw every byte.
func relayExactly(t *testing.T, want []byte, src, dst halfConn, relay, closeWrite func() error, counted func() int64) {
	t.Helper()
	sent := make(chan error, 1)
	go func() {
		err := writeChunks(src, want, int64(len(want)))
		src.CloseWrite()
		sent <- err
	}()
	relayed := make(chan error, 1)
	go func() {
		err := relay()
		closeWrite()
		relayed <- err
	}()
	dst.SetReadDeadline(time.Now().Add(time.Minute)) // a lost FIN fails, not hangs
	got, err := readSlowly(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := <-relayed; err != nil {
		t.Fatalf("the relay at the sender's FIN: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("received %d bytes, not the %d sent (or other bytes)", len(got), len(want))
	}
	if n := counted(); n != int64(len(want)) {
		t.Fatalf("the relay counted %d bytes, want %d", n, len(want))
	}
}

// TestPodToWireEndsAtOnce: an application that closes without sending,
// or resets, ends the direction (FIN: nil, RST: an error) instead of
// leaving it waiting on a socket with nothing to read.
func TestPodToWireEndsAtOnce(t *testing.T) {
	for _, reset := range []bool{false, true} {
		rig := newSpliceRig(t)
		done := make(chan error, 1)
		go func() { done <- rig.r.podToWire(rig.pod, rig.wire) }()
		time.Sleep(50 * time.Millisecond) // let it wait for data first
		if reset {
			rig.app.SetLinger(0)
		}
		rig.app.Close()
		select {
		case err := <-done:
			if reset && err == nil {
				t.Fatal("podToWire returned nil for a reset connection")
			}
			if !reset && err != nil {
				t.Fatalf("podToWire at the application's FIN: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("podToWire did not return after the application closed (reset %v)", reset)
		}
	}
}

// TestAbortWaitsForWriteFromNetstack: wireToPod writes to the application
// from segments netstack still holds; aborting the connection frees them,
// and their buffers go back to a pool that the link takes from for new
// frames. An abort while such a write is under way must wait for it: the
// application must get the bytes the peer sent (a prefix of them, up to
// the reset), never what a new owner of those buffers put there.
func TestAbortWaitsForWriteFromNetstack(t *testing.T) {
	// One P, so that the buffers the abort frees are the next ones handed
	// out (sync.Pool keeps them per P).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	rig := newSpliceRig(t)
	want := pattern(1<<20, 7)
	go writeChunks(rig.peer, want, 8)

	var once sync.Once
	var taken []*buffer.View
	t.Cleanup(func() {
		testHookPeeked = nil
		for _, v := range taken {
			v.Release()
		}
	})
	testHookPeeked = func(w *wireConn) {
		once.Do(func() {
			aborted := make(chan struct{})
			go func() { w.abort(); close(aborted) }()
			select {
			case <-aborted:
			case <-time.After(100 * time.Millisecond): // it waits, as it should
			}
			// Whatever the abort freed is taken again and overwritten.
			for size := 64; size <= 64<<10; size *= 2 {
				for range 64 {
					v := buffer.NewViewSize(size)
					copy(v.AsSlice(), bytes.Repeat([]byte{0xa5}, size))
					taken = append(taken, v)
				}
			}
		})
	}
	relayed := make(chan error, 1)
	go func() {
		relayed <- rig.r.wireToPod(rig.wire, rig.pod)
		rig.pod.Close()
	}()
	rig.app.SetReadDeadline(time.Now().Add(time.Minute))
	got, _ := io.ReadAll(rig.app)
	select {
	case <-relayed:
	case <-time.After(5 * time.Second):
		t.Fatal("wireToPod did not return after the abort")
	}
	if len(got) == 0 {
		t.Fatal("nothing reached the application before the abort")
	}
	if !bytes.Equal(got, want[:min(len(got), len(want))]) {
		t.Fatalf("the application received %d bytes that are not a prefix of what the peer sent: the abort freed buffers being written", len(got))
	}
}

// connectWire connects a peer to a wire end on port of the stack's
// address, both in netstack.
func connectWire(t *testing.T, s *tcpipstack.Stack, port uint16) (*wireConn, *gonet.TCPConn) {
	t.Helper()
	lnWQ := new(waiter.Queue)
	ln, terr := s.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, lnWQ)
	if terr != nil {
		t.Fatal(terr)
	}
	t.Cleanup(ln.Close)
	full := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{10, 0, 0, 1}), Port: port}
	if err := ln.Bind(full); err != nil {
		t.Fatal(err)
	}
	if err := ln.Listen(1); err != nil {
		t.Fatal(err)
	}
	peer, err := gonet.DialTCP(s, full, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	lnWQ.EventRegister(&entry)
	defer lnWQ.EventUnregister(&entry)
	for {
		ep, wq, terr := ln.Accept(nil)
		if _, wait := terr.(*tcpip.ErrWouldBlock); wait {
			select {
			case <-ready:
			case <-time.After(5 * time.Second):
				t.Fatal("netstack accepted nothing")
			}
			continue
		}
		if terr != nil {
			t.Fatal(terr)
		}
		w := newWireConn(ep, wq)
		t.Cleanup(func() { w.Close() })
		return w, peer
	}
}

// TestPodToWireReturnsBufferOnce: a pod-side socket that closes while the
// relay waits for it to become readable must not return the relay's copy
// buffer to the pool twice; a buffer returned twice is handed to two
// connections at once and mixes their data (seen as a redis server
// receiving its own "+OK" as a command).
func TestPodToWireReturnsBufferOnce(t *testing.T) {
	// One P: the pool's per-P slots are then all the test's to see.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	rig := newSpliceRig(t)
	c := rig.pod
	// A size no other test uses, so only this test's buffers match.
	r := &tcpRelay{env: &env{opts: Options{CopyBufferBytes: 4099}}}
	done := make(chan error, 1)
	go func() { done <- r.podToWire(c, nil) }()
	// Let it find nothing to read and wait (the EAGAIN path).
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("podToWire returned nil for a closed socket")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("podToWire did not return after its socket closed")
	}
	a, b := r.getBuf(), r.getBuf()
	if &a[0] == &b[0] {
		t.Fatal("the pool handed out the same copy buffer twice: it was returned twice")
	}
}

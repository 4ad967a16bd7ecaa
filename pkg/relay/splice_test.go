package relay

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// TestPodToWireReturnsBufferOnce: a pod-side socket that closes while the
// relay waits for it to become readable must not return the relay's copy
// buffer to the pool twice; a buffer returned twice is handed to two
// connections at once and mixes their data (seen as a redis server
// receiving its own "+OK" as a command).
func TestPodToWireReturnsBufferOnce(t *testing.T) {
	// One P: the pool's per-P slots are then all the test's to see.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A size no other test uses, so only this test's buffers match.
	r := &Relay{opts: Options{CopyBufferBytes: 4099}}
	done := make(chan error, 1)
	go func() { done <- r.podToWire(podConn{c.(*net.TCPConn)}, nil) }()
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

package relay

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair is a kernel TCP connection over loopback: a is the dialling
// end, b the accepted one (the relay's socket and the application's in
// a splice rig).
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestAppReaderTellsWhatIsLeft: each read says how many bytes the socket
// still holds, and a FIN not yet read counts, so that podToWire never
// waits on a socket whose end it has not seen.
func TestAppReaderTellsWhatIsLeft(t *testing.T) {
	if unix.CmsgSpace(4) != inqCmsgSpace {
		t.Fatalf("inqCmsgSpace is %d, the kernel's control message takes %d", inqCmsgSpace, unix.CmsgSpace(4))
	}
	a, b := tcpPair(t)
	rc, err := a.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ar := newAppReader(rc)
	if !ar.inq {
		t.Fatal("TCP_INQ refused on a TCP socket")
	}
	// read waits for data the way podToWire does: in an rc.Read callback.
	read := func(size int) (string, int) {
		t.Helper()
		buf := make([]byte, size)
		var n, left int
		var errno unix.Errno
		a.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := rc.Read(func(fd uintptr) bool {
			n, left, errno = ar.read(fd, buf)
			return errno != unix.EAGAIN
		}); err != nil {
			t.Fatal(err)
		}
		if errno != 0 {
			t.Fatalf("read: %v", errno)
		}
		return string(buf[:n]), left
	}
	settle := func() { time.Sleep(50 * time.Millisecond) } // loopback delivers at once; be sure
	b.Write([]byte("abc"))
	settle()
	if got, left := read(100); got != "abc" || left != 0 {
		t.Fatalf("read %q leaving %d, want \"abc\" leaving 0", got, left)
	}
	b.Write([]byte("0123456789"))
	settle()
	if got, left := read(4); got != "0123" || left != 6 {
		t.Fatalf("read %q leaving %d, want \"0123\" leaving 6", got, left)
	}
	b.Write([]byte("x"))
	b.CloseWrite()
	settle()
	if got, left := read(100); got != "456789x" || left == 0 {
		t.Fatalf("read %q leaving %d, want \"456789x\" and the FIN left (not 0)", got, left)
	}
	if got, _ := read(100); got != "" {
		t.Fatalf("read %q after everything, want the end (0 bytes)", got)
	}
}

// TestPodToWireOneReadPerAnswer: an answer that the application writes
// at once costs podToWire one read, not a second one that finds the
// socket empty.
func TestPodToWireOneReadPerAnswer(t *testing.T) {
	rig := newSpliceRig(t)
	var reads, empty atomic.Int64
	testHookAppRead = func(n int, errno unix.Errno) {
		reads.Add(1)
		if errno == unix.EAGAIN {
			empty.Add(1)
		}
	}
	t.Cleanup(func() { testHookAppRead = nil })
	done := make(chan error, 1)
	go func() { done <- rig.r.podToWire(rig.pod, rig.wire) }()
	const answers = 200
	answer := bytes.Repeat([]byte("a"), 300)
	buf := make([]byte, len(answer))
	rig.peer.SetReadDeadline(time.Now().Add(time.Minute))
	for i := range answers {
		if _, err := rig.app.Write(answer); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rig.peer, buf); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	rig.app.CloseWrite()
	if err := <-done; err != nil {
		t.Fatalf("podToWire at the application's FIN: %v", err)
	}
	// One read per answer and one for the FIN; a few answers may be read
	// in two parts, or after a stale wake-up, under the race detector.
	t.Logf("%d reads (%d found nothing) for %d answers", reads.Load(), empty.Load(), answers)
	if e := empty.Load(); e > answers/10 {
		t.Fatalf("%d of %d reads found nothing for %d answers: podToWire reads again after emptying the socket", e, reads.Load(), answers)
	}
}

// TestPodToWireSeesFINBehindData: data and the FIN queued together (an
// application that answers and closes) are both passed on although the
// netpoller reports them as one event.
func TestPodToWireSeesFINBehindData(t *testing.T) {
	for i := range 20 {
		rig := newSpliceRig(t)
		waiting := i%2 == 1 // podToWire already waiting, or started after
		done := make(chan error, 1)
		start := func() { go func() { done <- rig.r.podToWire(rig.pod, rig.wire) }() }
		if waiting {
			start()
			time.Sleep(10 * time.Millisecond)
		}
		rig.app.Write([]byte("bye"))
		rig.app.CloseWrite()
		if !waiting {
			time.Sleep(10 * time.Millisecond)
			start()
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("podToWire at the application's FIN: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("podToWire missed the FIN behind the data (already waiting: %v)", waiting)
		}
		rig.wire.CloseWrite()
		rig.peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 3)
		if _, err := io.ReadFull(rig.peer, buf); err != nil || string(buf) != "bye" {
			t.Fatalf("the peer read %q, %v; want \"bye\"", buf, err)
		}
	}
}

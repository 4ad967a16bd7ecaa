package wirelink

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/rawfile"
)

// countingSink is a batchSink over fixed buffers that counts what it is
// handed.
type countingSink struct {
	bufs      [4][64]byte
	iovecs    [4]unix.Iovec
	hdrs      [4]rawfile.MMsgHdr
	fills     int
	delivered int
	batches   int
}

func newCountingSink() *countingSink {
	s := &countingSink{}
	for k := range s.hdrs {
		s.iovecs[k] = rawfile.IovecFromBytes(s.bufs[k][:])
		s.hdrs[k].Msg.Iov = &s.iovecs[k]
		s.hdrs[k].Msg.SetIovlen(1)
	}
	return s
}

func (s *countingSink) fill()         { s.fills++ }
func (s *countingSink) deliver(n int) { s.delivered += n; s.batches++ }

// datagramPair returns a socket pair: frames written to the first are read
// from the second.
func datagramPair(t *testing.T) (w, r int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func sendFrames(t testing.TB, fd, n int) {
	t.Helper()
	frame := []byte("frame")
	for range n {
		if _, err := unix.Write(fd, frame); err != nil {
			t.Fatalf("writing a frame: %v", err)
		}
	}
}

// TestRecvLoopBudget: a loop with a budget reads that many frames a turn
// and says it spent it; one without reads until the socket is empty, and
// a batch that was not full ends the turn without another recvmmsg.
func TestRecvLoopBudget(t *testing.T) {
	w, r := datagramPair(t)
	if err := unix.SetNonblock(r, true); err != nil {
		t.Fatal(err)
	}
	sink := newCountingSink()
	var l recvLoop
	l.readInto(sink.hdrs[:], sink, 8)

	sendFrames(t, w, 10)
	if !l.serveBatches(uintptr(r)) || !l.spent || l.err != nil {
		t.Fatalf("a turn over budget: got spent %v err %v, want spent", l.spent, l.err)
	}
	if sink.delivered != 8 {
		t.Errorf("a turn of budget 8 delivered %d frames, want 8", sink.delivered)
	}
	l.spent = false
	if l.serveBatches(uintptr(r)) || l.spent {
		t.Fatal("the turn that emptied the socket did not wait for it")
	}
	if sink.delivered != 10 || sink.batches != 3 {
		t.Errorf("delivered %d frames in %d batches, want 10 in 3", sink.delivered, sink.batches)
	}

	l.budget = 0
	sendFrames(t, w, 4)
	fills := sink.fills
	if l.serveBatches(uintptr(r)) {
		t.Fatal("a turn without budget ended the wait")
	}
	// Full batch, then the empty read that says EAGAIN.
	if got := sink.fills - fills; got != 2 {
		t.Errorf("reading one full batch took %d recvmmsg, want 2", got)
	}
	if sink.delivered != 14 {
		t.Errorf("delivered %d frames, want 14", sink.delivered)
	}
}

// TestRecvLoopAllocatesNothing: reading and delivering a batch allocates
// nothing of the loop's own.
func TestRecvLoopAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	w, r := datagramPair(t)
	if err := unix.SetNonblock(r, true); err != nil {
		t.Fatal(err)
	}
	sink := newCountingSink()
	var l recvLoop
	l.readInto(sink.hdrs[:], sink, 0)
	if n := testing.AllocsPerRun(100, func() {
		sendFrames(t, w, 3)
		l.serveBatches(uintptr(r))
	}); n != 0 {
		t.Errorf("a batch allocated %v times, want 0", n)
	}
}

// TestPollLoopReportsFailureNotStop: a socket error reaches failed with
// what was being read; stopping the loop reports nothing.
func TestPollLoopReportsFailureNotStop(t *testing.T) {
	_, r := datagramPair(t)
	failed := make(chan error, 1)
	var l pollLoop
	if err := l.open(r, "test socket", "reading the test socket"); err != nil {
		t.Fatal(err)
	}
	l.failed = func(err error) { failed <- err }
	l.serve = func(uintptr) bool { l.err = unix.ENETDOWN; return true }
	l.start()
	select {
	case err := <-failed:
		if !errors.Is(err, unix.ENETDOWN) || err.Error() != "reading the test socket: "+unix.ENETDOWN.Error() {
			t.Errorf("failed got %v, want reading the test socket: ENETDOWN", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the loop did not report its socket's error")
	}
	<-l.done
	l.stop() // after the loop ended: closes its file, returns

	var m pollLoop
	if err := m.open(r, "test socket", "reading the test socket"); err != nil {
		t.Fatal(err)
	}
	m.failed = func(err error) { failed <- err }
	m.serve = func(uintptr) bool { return false } // nothing comes
	m.start()
	m.stop()
	select {
	case err := <-failed:
		t.Errorf("a stopped loop reported %v", err)
	default:
	}
}

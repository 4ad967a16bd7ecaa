package podstack

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/rawfile"
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
		// again). Stack.Failed.
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

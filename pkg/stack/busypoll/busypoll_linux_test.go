package busypoll

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// echoPeer starts cat(1): what is written to the first descriptor comes
// back on the second, from another process, so that with one P nothing
// but the netpoller can wake a goroutine waiting for it.
func echoPeer(t *testing.T) (w, r syscall.RawConn) {
	t.Helper()
	cmd := exec.Command("cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	if w, err = in.(*os.File).SyscallConn(); err != nil {
		t.Fatal(err)
	}
	if r, err = out.(*os.File).SyscallConn(); err != nil {
		t.Fatal(err)
	}
	return w, r
}

// pingPong makes n one-byte round trips through cat, reporting each answer
// to p as the relay reports a read. Like the relay, it reads and writes
// with raw system calls and waits on the netpoller: a system call the
// scheduler hears of may hand the one P to another thread, which polls
// the network on its way (runtime.handoffp) and would hide what is tested.
func pingPong(t *testing.T, p *Poller, w, r syscall.RawConn, n int) {
	t.Helper()
	b := []byte{'x'}
	for i := range n {
		var errno syscall.Errno
		if err := w.Write(func(fd uintptr) bool {
			_, _, errno = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), 1)
			return errno != syscall.EAGAIN
		}); err != nil || errno != 0 {
			t.Fatalf("round trip %d: writing: %v %v", i, err, errno)
		}
		var got uintptr
		if err := r.Read(func(fd uintptr) bool {
			got, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), 1)
			return errno != syscall.EAGAIN
		}); err != nil || errno != 0 || got != 1 {
			t.Fatalf("round trip %d: reading: %v %v (%d bytes)", i, err, errno, got)
		}
		p.Touch()
	}
}

// The instance New watches is the runtime's: a pipe the runtime polls is
// registered in it.
func TestRuntimeEpollIsTheNetpollers(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	epfd, err := runtimeEpoll()
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", epfd))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("tfd: %8d ", r.Fd())
	if !strings.Contains(string(info), want) {
		t.Fatalf("fd %d is not the netpoller's: its fdinfo has no %q:\n%s", epfd, want, info)
	}
}

// With one P and the Poller spinning, the scheduler does not poll the
// network: an answer reaches the goroutine waiting for it when the Poller
// sees the runtime's event and steps aside (a hand-off), or else when
// another thread blocked in the netpoller wakes for it (the runtime keeps
// one there at times; then the Poller loses the race now and then, which
// costs that thread's wake-up but nothing else). A Poller that never saw
// an event would leave every round trip to those, or to sysmon's poll
// every 10 ms.
func TestPollerHandsEventsToTheNetpoller(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w, r := echoPeer(t)
	p, err := New(MaxWindow)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(p.Close)
	pingPong(t, p, w, r, 10) // cat is running and the window open
	const n = 500
	for attempt := range 5 {
		h0 := p.Stats().Handoffs.Load()
		pingPong(t, p, w, r, n)
		handoffs := p.Stats().Handoffs.Load() - h0
		t.Logf("%d round trips: %d hand-offs", n, handoffs)
		if handoffs > 0 {
			return
		}
		// The thread in the netpoller took every event first; it
		// leaves the netpoller once it finds the P taken.
		t.Logf("attempt %d: no hand-off", attempt)
	}
	t.Errorf("no hand-off in 5 × %d round trips: the Poller did not see the runtime's events", n)
}

// Outside a window the Poller costs nothing: it stops polling, and
// traffic brings it back.
func TestPollerStopsAfterTheWindow(t *testing.T) {
	p, err := New(50 * time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(p.Close)
	quiet := func() uint64 {
		t.Helper()
		last := p.Stats().Polls.Load()
		for range 500 {
			time.Sleep(20 * time.Millisecond)
			now := p.Stats().Polls.Load()
			if now == last {
				return now
			}
			last = now
		}
		t.Fatal("the Poller still polls 10 s after its last traffic")
		return 0
	}
	for i := range 3 {
		before := quiet()
		p.Touch()
		for p.Stats().Polls.Load() == before {
			time.Sleep(time.Millisecond) // the test's deadline bounds this
		}
		t.Logf("burst %d: %d polls", i, quiet()-before)
	}
}

// Disabled, a Poller ignores traffic and ends the window it is in: the
// governor turns it off for bulk traffic and a busy node, and it must
// then cost nothing.
func TestDisabledPollerIgnoresTraffic(t *testing.T) {
	p, err := New(MaxWindow)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(p.Close)
	p.Touch()
	for p.Stats().Polls.Load() == 0 {
		time.Sleep(time.Millisecond) // the test's deadline bounds this
	}
	p.SetEnabled(false)
	// The window in progress ends at its next poll: well before its
	// 10 ms run out, and with no Touch after it, it does not restart.
	time.Sleep(5 * time.Millisecond)
	ended := p.Stats().Polls.Load()
	for range 20 {
		p.Touch()
		time.Sleep(time.Millisecond)
	}
	if now := p.Stats().Polls.Load(); now != ended {
		t.Fatalf("a disabled Poller polled %d times after Touch", now-ended)
	}
	if p.Enabled() || p.Stats().Enabled.Load() != 0 {
		t.Fatalf("Enabled() = %v, Enabled count %d after turning off", p.Enabled(), p.Stats().Enabled.Load())
	}
	p.SetEnabled(true)
	p.SetEnabled(true)
	p.Touch()
	for p.Stats().Polls.Load() == ended {
		time.Sleep(time.Millisecond)
	}
	if n := p.Stats().Enabled.Load(); n != 1 {
		t.Errorf("Enabled count %d after one switch on, want 1", n)
	}
}

func TestNewRefusesAWindowOutOfRange(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Microsecond, MaxWindow + 1} {
		if p, err := New(d); err == nil {
			p.Close()
			t.Errorf("New(%s) succeeded", d)
		}
	}
}

// Several Pollers in one process (tests of several stacks) each find the
// runtime's instance, not another Poller's.
func TestPollersCoexist(t *testing.T) {
	var ps []*Poller
	for range 3 {
		p, err := New(time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	ps[0].Close()
	p, err := New(time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	for _, p := range ps[1:] {
		p.Close()
	}
}

func TestCloseWithoutStartAndTwice(t *testing.T) {
	p, err := New(time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	var nilPoller *Poller
	nilPoller.Touch()
}

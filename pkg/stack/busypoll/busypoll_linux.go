// Package busypoll keeps a pod stack's one thread awake for a bounded time
// after traffic, so that the next frame or answer finds it running instead
// of asleep in the kernel: the stack's own SO_BUSY_POLL.
//
// Why. The stack's goroutines wait for their sockets on Go's netpoller.
// When all of them wait, the stack's one thread sleeps in epoll_wait, and
// each request wakes it from an idle CPU; on a VM that wake-up, not the
// stack's work, is most of a request's latency (docs/performance.md,
// "Busy polling"). Go offers no hook to poll its netpoller without
// blocking for a while, and a goroutine that simply yields in a loop keeps
// the scheduler from polling it at all: the scheduler polls the network
// only when it finds nothing else to run.
//
// How. A Poller owns an epoll instance of its own that watches the Go
// runtime's epoll instance: the runtime's becomes readable while an event
// waits in it, and watching it consumes nothing (the kernel checks the
// waiting events without delivering them). During a window after traffic,
// the Poller's goroutine polls its own instance without blocking and
// otherwise yields. When an event waits, it parks: the scheduler, finding
// nothing else to run, polls the netpoller without blocking and runs the
// goroutines it wakes. Those report traffic (Touch), which brings the
// Poller back to the front of the queue. An event that wakes nobody who
// reports traffic leaves the Poller parked and the thread sleeps as it
// would without it: the window ends, nothing is missed.
package busypoll

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxWindow bounds the window: Linux's busy_poll sysctl takes microseconds
// too, and a window longer than this is a core spent, not a wait saved.
const MaxWindow = 10 * time.Millisecond

// Stats counts what a Poller did.
type Stats struct {
	// Windows is how many times traffic woke a parked Poller.
	Windows atomic.Uint64
	// Handoffs is how many times the Poller saw an event waiting and
	// stepped aside for the netpoller to take it.
	Handoffs atomic.Uint64
	// Polls is how many non-blocking polls it made.
	Polls atomic.Uint64
	// Enabled counts the times SetEnabled turned a disabled Poller on.
	Enabled atomic.Uint64
}

// Poller busy-polls the runtime's netpoller for a window after each Touch.
type Poller struct {
	window  time.Duration
	epfd    int
	enabled atomic.Bool
	touched atomic.Bool
	parked  atomic.Bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	stats   Stats

	started   atomic.Bool
	closeOnce sync.Once
}

// New returns a Poller with the given window, enabled and not yet running.
// It must be
// called after the runtime's netpoller exists (any os.File or net.Conn on
// a pollable descriptor creates it; New makes sure with a pipe), and while
// /proc/self/fd is readable (before a sandbox).
func New(window time.Duration) (*Poller, error) {
	if window <= 0 || window > MaxWindow {
		return nil, fmt.Errorf("busy-poll window %s outside (0, %s]", window, MaxWindow)
	}
	mu.Lock()
	defer mu.Unlock()
	rt, err := runtimeEpoll()
	if err != nil {
		return nil, fmt.Errorf("finding the Go runtime's epoll instance: %w", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the busy-poll epoll instance: %w", err)
	}
	// Level-triggered: readable for as long as an event waits in the
	// runtime's instance, however often it is asked.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, rt, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(rt)}); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("watching the Go runtime's epoll instance (fd %d): %w", rt, err)
	}
	pollers[epfd] = true
	p := &Poller{
		window: window,
		epfd:   epfd,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	p.enabled.Store(true)
	return p, nil
}

// SetEnabled turns the Poller on or off. Off, Touch does nothing and a
// window in progress ends at the next poll: the thread sleeps between
// requests as it would without a Poller. The stack's governor
// (pkg/stack/governor) switches it with the traffic and the node's idle
// CPU.
func (p *Poller) SetEnabled(on bool) {
	if p.enabled.Swap(on) != on && on {
		p.stats.Enabled.Add(1)
	}
}

// Enabled says whether the Poller is on.
func (p *Poller) Enabled() bool { return p.enabled.Load() }

// pollers holds the epoll descriptors of the open Pollers, which
// runtimeEpoll must not take for the runtime's. mu keeps a descriptor
// from being closed and reused between a scan and a registration.
var (
	mu      sync.Mutex
	pollers = map[int]bool{}
)

// runtimeEpoll finds the Go runtime's epoll descriptor: the one epoll
// instance open in this process that is not a Poller's.
func runtimeEpoll() (int, error) {
	// Make sure the netpoller has been created.
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	r.Close()
	w.Close()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1, err
	}
	found := -1
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || target != "anon_inode:[eventpoll]" {
			continue
		}
		if pollers[fd] {
			continue
		}
		if found >= 0 {
			return -1, fmt.Errorf("two epoll instances open (fds %d and %d): cannot tell the runtime's", found, fd)
		}
		found = fd
	}
	if found < 0 {
		return -1, errors.New("no epoll instance open")
	}
	return found, nil
}

// Start runs the Poller's goroutine.
func (p *Poller) Start() {
	p.started.Store(true)
	go p.run()
}

// Close stops the Poller, started or not, and releases its epoll
// instance. It may be called more than once.
func (p *Poller) Close() {
	p.closeOnce.Do(func() {
		close(p.stop)
		if p.started.Load() {
			<-p.done
		}
		mu.Lock()
		delete(pollers, p.epfd)
		unix.Close(p.epfd)
		mu.Unlock()
	})
}

// Stats returns the Poller's counters.
func (p *Poller) Stats() *Stats { return &p.stats }

// Window returns the Poller's window.
func (p *Poller) Window() time.Duration { return p.window }

// Touch reports traffic: the window starts again, and a parked Poller
// runs. It is cheap enough for every batch a reader takes in. A nil
// Poller does nothing.
func (p *Poller) Touch() {
	if p == nil || !p.enabled.Load() {
		return
	}
	p.touched.Store(true)
	if p.parked.Load() && p.parked.CompareAndSwap(true, false) {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

func (p *Poller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 1)
	for {
		// Park until traffic. touched is read after parked is set, so a
		// Touch between the two is seen by one of them.
		p.parked.Store(true)
		if !p.touched.Swap(false) {
			select {
			case <-p.wake:
			case <-p.stop:
				return
			}
		} else {
			p.parked.Store(false)
		}
		p.stats.Windows.Add(1)
		deadline := time.Now().Add(p.window)
		for {
			now := time.Now()
			if p.touched.Swap(false) {
				deadline = now.Add(p.window)
			}
			if now.After(deadline) || !p.enabled.Load() {
				break
			}
			select {
			case <-p.stop:
				return
			default:
			}
			p.stats.Polls.Add(1)
			// Raw: a zero timeout never blocks, and the scheduler need
			// not hear of it (pkg/stack/relay/rawio.go says why that matters
			// with one P).
			n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.epfd), uintptr(unsafe.Pointer(&events[0])), 1, 0, 0, 0)
			if errno == 0 && n > 0 {
				// An event waits for the netpoller. Step aside: with
				// nothing else runnable the scheduler polls it at once
				// and runs what it wakes, whose Touch brings us back.
				p.stats.Handoffs.Add(1)
				p.parked.Store(true)
				p.touched.Store(false)
				select {
				case <-p.wake:
				case <-p.stop:
					return
				}
				deadline = time.Now().Add(p.window)
				continue
			}
			runtime.Gosched()
		}
	}
}

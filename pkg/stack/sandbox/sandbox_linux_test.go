package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary a child that sandboxes itself in the
// mode given and runs the checks of childChecks.
const childEnv = "SANDBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(Mode(mode), os.Getenv("SANDBOX_TEST_DIR")))
	}
	os.Exit(m.Run())
}

// child is one sandboxed child process seen from the test.
type child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   *bufio.Scanner
	results map[string]string // check name -> "" when ok, else why not
}

// startChild runs the checks of mode in a child and stops it at its pause,
// with the sandbox still in force, so that the test can look at it.
func startChild(t *testing.T, mode Mode) (*child, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: dropping the bounding set takes CAP_SETPCAP")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "existing"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(mode), "SANDBOX_TEST_DIR="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), results: map[string]string{}}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	for c.lines.Scan() {
		line := c.lines.Text()
		if line == "pause" {
			return c, dir
		}
		name, why, _ := strings.Cut(line, " ")
		c.results[name] = why
	}
	t.Fatalf("child exited before its pause (results so far: %v)", c.results)
	return nil, ""
}

// finish lets the child exit and checks it exited cleanly.
func (c *child) finish(t *testing.T) {
	t.Helper()
	c.stdin.Close()
	for c.lines.Scan() {
		name, why, _ := strings.Cut(c.lines.Text(), " ")
		c.results[name] = why
	}
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("child exit: %v (a denied call in the runtime's exit path?)", err)
	}
}

// expect checks that exactly the named checks ran, and each passed.
func (c *child) expect(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		why, ran := c.results[n]
		switch {
		case !ran:
			t.Errorf("%s: did not run", n)
		case why != "":
			t.Errorf("%s: %s", n, why)
		}
	}
	for n := range c.results {
		if !slices.Contains(names, n) {
			t.Errorf("unexpected check %s: %q", n, c.results[n])
		}
	}
}

// TestDeniesWhatTheStackDoesNotNeed: after Apply(On), new sockets, files,
// processes, executable memory and signals to other processes fail with
// EPERM, while what the stack does while serving still works; every
// thread, also those made after the filter, holds no capability and has
// the filter and no_new_privs.
func TestDeniesWhatTheStackDoesNotNeed(t *testing.T) {
	c, dir := startChild(t, On)
	threads, err := ReadThreads(c.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// 8 threads locked before Apply and 8 after, besides the runtime's.
	if len(threads) < 17 {
		t.Errorf("child has %d threads, want at least 17", len(threads))
	}
	for _, th := range threads {
		if !th.Unprivileged() || th.NoNewPrivs != 1 || th.Seccomp != 2 || th.SeccompCount != 1 {
			t.Errorf("thread %d: got %+v, want no capabilities, NoNewPrivs 1, Seccomp 2 with 1 filter", th.TID, th)
		}
	}
	c.finish(t)
	c.expect(t, append(slices.Clone(deniedChecks), allowedChecks...)...)
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file the sandboxed child tried to create: stat: got %v, want not exist", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "existing")); err != nil {
		t.Errorf("file the sandboxed child tried to remove: %v, want it still there", err)
	}
}

// TestLogModeAllows: in mode Log the filter is there but a call outside
// the allowlist runs (the kernel logs it).
func TestLogModeAllows(t *testing.T) {
	c, _ := startChild(t, Log)
	threads, err := ReadThreads(c.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range threads {
		if !th.Unprivileged() || th.Seccomp != 2 {
			t.Errorf("thread %d: got %+v, want no capabilities and Seccomp 2", th.TID, th)
		}
	}
	c.finish(t)
	c.expect(t, "log-socket-unix", "log-openat")
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": On, "on": On, "log": Log, "off": Off} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMode("of"); err == nil || !strings.Contains(err.Error(), EnvVar) {
		t.Errorf("ParseMode(%q): got %v, want an error naming %s", "of", err, EnvVar)
	}
}

func TestFilterBuildsInBothModes(t *testing.T) {
	on, err := program(On, 1234)
	if err != nil {
		t.Fatal(err)
	}
	log, err := program(Log, 1234)
	if err != nil {
		t.Fatal(err)
	}
	if len(on) != len(log) || slices.Equal(on, log) {
		t.Errorf("log filter: got %d instructions, equal to the deny filter: %v; want the same length, different returns", len(log), slices.Equal(on, log))
	}
}

var deniedChecks = []string{
	"socket-raw", "socket-raw6", "socket-inet-sctp", "socket-unix", "socket-netlink", "socket-packet", "socketpair",
	"openat-create", "openat-existing", "unlinkat",
	"execve", "fork", "mmap-exec", "kill-other", "tgkill-other",
	"prctl", "ptrace", "setns",
}

var allowedChecks = []string{
	"transparent-low-port", "transparent-dial", "accept-existing-listener", "echo", "signal-self", "new-threads",
	"gc", "getrandom", "cpu-profile", "sleep",
}

// runChild is the child's side: set up like the stack (descriptors and
// signal handlers first), Apply, run the checks, print one line per check,
// pause until stdin closes.
func runChild(mode Mode, dir string) int {
	report := func(name string, err error) {
		if err != nil {
			fmt.Printf("%s %v\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Printf("%s\n", name)
		}
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "ctl.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		return 1
	}
	client, err := net.Dial("unix", filepath.Join(dir, "ctl.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	tcpLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen tcp:", err)
		return 1
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	// Threads that exist before Apply and stay: the drop must reach them.
	lockThreads(8, make(chan struct{}))

	if _, err := Apply(mode); err != nil {
		fmt.Fprintln(os.Stderr, "apply:", err)
		return 1
	}

	if mode == Log {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
		report("log-socket-unix", err)
		unix.Close(fd)
		fd, err = unix.Open("/proc/self/status", unix.O_RDONLY, 0)
		report("log-openat", err)
		unix.Close(fd)
	} else {
		for _, c := range denials(dir) {
			err := c.try()
			switch {
			case err == nil:
				report(c.name, errors.New("allowed, want EPERM"))
			case !errors.Is(err, unix.EPERM):
				report(c.name, fmt.Errorf("got %w, want EPERM", err))
			default:
				report(c.name, nil)
			}
		}
		for _, c := range allowances(ln, client, tcpLn, usr1) {
			report(c.name, c.try())
		}
	}
	fmt.Println("pause")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// lockThreads parks n goroutines each on its own thread until release
// closes, so that the process has threads that exist but are idle.
func lockThreads(n int, release chan struct{}) {
	for range n {
		go func() {
			runtime.LockOSThread()
			<-release
		}()
	}
}

type check struct {
	name string
	try  func() error
}

func errnoOf(_ uintptr, _ uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

func denials(dir string) []check {
	socket := func(domain, typ int) func() error {
		return func() error {
			fd, err := unix.Socket(domain, typ, 0)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}
	}
	return []check{
		{"socket-raw", socket(unix.AF_INET, unix.SOCK_RAW)},
		{"socket-raw6", socket(unix.AF_INET6, unix.SOCK_RAW)},
		{"socket-inet-sctp", func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"socket-unix", socket(unix.AF_UNIX, unix.SOCK_STREAM)},
		{"socket-netlink", socket(unix.AF_NETLINK, unix.SOCK_RAW)},
		{"socket-packet", socket(unix.AF_PACKET, unix.SOCK_RAW)},
		{"socketpair", func() error { _, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0); return err }},
		{"openat-create", func() error {
			_, err := unix.Openat(unix.AT_FDCWD, filepath.Join(dir, "new"), unix.O_CREAT|unix.O_WRONLY, 0o600)
			return err
		}},
		{"openat-existing", func() error { _, err := unix.Open("/etc/passwd", unix.O_RDONLY, 0); return err }},
		{"unlinkat", func() error { return unix.Unlink(filepath.Join(dir, "existing")) }},
		{"execve", func() error { return unix.Exec("/bin/true", []string{"true"}, nil) }},
		// A plain fork: clone without CLONE_THREAD. Should it ever be
		// allowed, the child exits at once without touching Go state.
		{"fork", func() error {
			r, _, e := syscall.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
			if e == 0 && r == 0 {
				syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
			}
			if e != 0 {
				return e
			}
			return nil
		}},
		{"mmap-exec", func() error {
			b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err == nil {
				unix.Munmap(b)
			}
			return err
		}},
		{"kill-other", func() error { return unix.Kill(1, 0) }},
		{"tgkill-other", func() error { return unix.Tgkill(1, 1, 0) }},
		{"prctl", func() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) }},
		{"ptrace", func() error { return errnoOf(syscall.RawSyscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0)) }},
		{"setns", func() error { return unix.Setns(0, unix.CLONE_NEWNET) }},
	}
}

func allowances(ln net.Listener, client net.Conn, tcpLn net.Listener, usr1 chan os.Signal) []check {
	var server net.Conn
	return []check{
		// What the relay's pod side does per connection: a transparent
		// socket bound to an address that is not its own (127.0.0.2 stays
		// on loopback), connected to a listener.
		// A flow's socket answering for a remote port below 1024 (DNS).
		{"transparent-low-port", func() error {
			c, err := podsock.DialUDP(netip.MustParseAddrPort("127.0.0.2:1"), netip.MustParseAddrPort("127.0.0.1:9"))
			if err != nil {
				return err
			}
			return c.Close()
		}},
		{"transparent-dial", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := podsock.DialTCP(ctx, netip.MustParseAddrPort("127.0.0.2:0"), tcpLn.Addr().(*net.TCPAddr).AddrPort())
			if err != nil {
				return err
			}
			c.Close()
			a, err := tcpLn.Accept()
			if err != nil {
				return err
			}
			return a.Close()
		}},
		{"accept-existing-listener", func() (err error) {
			server, err = ln.Accept()
			return err
		}},
		{"echo", func() error {
			if server == nil {
				return errors.New("no connection")
			}
			if _, err := client.Write([]byte("ping")); err != nil {
				return err
			}
			b := make([]byte, 4)
			if _, err := io.ReadFull(server, b); err != nil {
				return err
			}
			if _, err := server.Write(b); err != nil {
				return err
			}
			if _, err := io.ReadFull(client, b); err != nil || string(b) != "ping" {
				return fmt.Errorf("echo: got %q, %v", b, err)
			}
			return server.Close()
		}},
		{"signal-self", func() error {
			if err := unix.Kill(os.Getpid(), unix.SIGUSR1); err != nil {
				return err
			}
			select {
			case <-usr1:
				return nil
			case <-time.After(5 * time.Second):
				return errors.New("SIGUSR1 not delivered")
			}
		}},
		{"new-threads", func() error {
			lockThreads(8, make(chan struct{}))
			// Each locked goroutine needs a thread of its own: wait until
			// the runtime made them.
			time.Sleep(200 * time.Millisecond)
			return nil
		}},
		{"gc", func() error {
			var keep [][]byte
			for range 64 {
				keep = append(keep, make([]byte, 1<<20))
			}
			keep = nil
			runtime.GC()
			debug.FreeOSMemory()
			return nil
		}},
		{"getrandom", func() error { _, err := rand.Read(make([]byte, 32)); return err }},
		{"cpu-profile", func() error {
			var buf bytes.Buffer
			if err := pprof.StartCPUProfile(&buf); err != nil {
				return err
			}
			for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			}
			pprof.StopCPUProfile()
			if buf.Len() < 100 {
				return fmt.Errorf("profile of %d bytes", buf.Len())
			}
			return nil
		}},
		{"sleep", func() error { time.Sleep(10 * time.Millisecond); return nil }},
	}
}

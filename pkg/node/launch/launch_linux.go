// Package launch starts a pod's stack process inside the pod's network
// namespace, waits for its readiness, and stops it without ever signalling
// a process that merely reuses its PID.
package launch

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Options says what to start and where.
type Options struct {
	// Binary is the cni-usernet executable. Zero: this process's own.
	Binary string
	// Args follow the binary name (e.g. "stack", "--config", path).
	Args []string
	// Netns is the pod's network namespace path. Required.
	Netns string
	// WireNetns, when set, is the stack's own network namespace (pkg/node/wirens),
	// opened here and handed to the process as descriptor WireNetnsFD:
	// the process may start in another mount namespace (MountNS), where
	// the pin is not mounted.
	WireNetns string
	// LogPath receives the process's stdout and stderr, so that it never
	// holds the runtime's pipes open (a runtime waits for them to close).
	// The stack caps it and rotates it into RotatedLog(LogPath), which is
	// handed to it as descriptor LogRotatedFD.
	LogPath string
	// ReadyTimeout bounds the wait for readiness. Required.
	ReadyTimeout time.Duration
	// CgroupPath, when set, is the cgroup (relative to the hierarchy roots
	// under CgroupRoot) the process joins: the pod's, so the stack is
	// charged to the pod. Failing to join it fails Start.
	CgroupPath string
	// Cgroups, when set, are /proc/PID/cgroup lines to put the process in
	// (see Cgroups), looked up under CgroupRoot (default /sys/fs/cgroup).
	// Failing to join them is logged by the caller through Process.Warning,
	// not fatal: a stack restarted in the wrong cgroup beats no stack.
	Cgroups    []string
	CgroupRoot string
	// MountNS, when set, is a mount namespace (e.g. /proc/1/ns/mnt) the
	// process is started in: a supervisor in a container restarts stacks in
	// the host's, so that Binary and every path mean what they meant to the
	// plugin that started the stack first.
	MountNS string
	// OOMScoreAdj is the process's oom_score_adj. Zero: StackOOMScoreAdj.
	// Failing to set it is reported through Process.Warning.
	OOMScoreAdj int
}

// Process identifies a started stack: PID plus the kernel's start time.
type Process struct {
	PID       int
	StartTime uint64
	// Warning reports a non-fatal problem of the start (recorded
	// cgroups, oom_score_adj).
	Warning error `json:"-"`
}

// ReadyFD is the descriptor number on which the stack reports readiness:
// one line, "ok" or "error: <message>", then EOF.
const ReadyFD = 3

// WireNetnsFD is the descriptor of Options.WireNetns in the process, which
// the environment variable WireNetnsEnv names when it is passed.
const (
	WireNetnsFD  = 4
	WireNetnsEnv = "CNI_USERNET_WIRE_NETNS_FD"
)

// LogRotatedFD is the descriptor of RotatedLog(Options.LogPath) in the
// process, which LogRotatedEnv names. The stack, which may open no file
// once sandboxed, rotates its log (stderr, opened for reading and
// appending) into it: pkg/stack/logfile.
const (
	LogRotatedFD  = 5
	LogRotatedEnv = "CNI_USERNET_LOG_ROTATED_FD"
)

// LogMaxBytesEnv, in the launcher's environment, sets the stack's cap on
// each of its log files in bytes (pkg/stack/logfile.MaxBytes when unset),
// for tests that watch rotation without writing megabytes.
const LogMaxBytesEnv = "CNI_USERNET_LOG_MAX_BYTES"

// RotatedLog is the file a stack's log at logPath is rotated into.
func RotatedLog(logPath string) string { return logPath + ".1" }

// Start launches the process in the namespace and waits until it reports
// ready. On any failure the process is killed and reaped before Start
// returns, and the error carries the process's own message.
func Start(o Options) (Process, error) {
	if o.Binary == "" {
		self, err := os.Executable()
		if err != nil {
			return Process{}, fmt.Errorf("finding own executable: %w", err)
		}
		o.Binary = self
	}
	f, err := openFiles(o)
	if err != nil {
		return Process{}, err
	}
	defer f.Close()
	cmd := command(o, f)
	// A child inherits the network namespace of the thread that forks it;
	// ns.Do runs this on a locked thread switched into the pod's namespace.
	if o.MountNS != "" {
		err = startInMountNS(cmd, f.netns, o.MountNS)
	} else {
		err = f.netns.Do(func(ns.NetNS) error { return cmd.Start() })
	}
	// The child holds the readiness pipe's write end now; with ours
	// closed, EOF means it exited.
	f.readyW.Close()
	if err != nil {
		return Process{}, fmt.Errorf("starting stack: %w", err)
	}
	p, err := awaitReady(cmd, o, f.ready)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return Process{}, err
	}
	// The stack outlives us; the runtime's init (or subreaper) reaps it.
	cmd.Process.Release()
	return p, nil
}

// files are what Start holds open while it starts the process: the log
// and the readiness pipe the process inherits, the stack's namespace it
// is handed, and the pod's namespace it is started in. Close closes
// them all; the process keeps its own copies.
type files struct {
	log, rotated  *os.File
	ready, readyW *os.File
	wire          *os.File // nil without Options.WireNetns
	netns         ns.NetNS
}

func openFiles(o Options) (_ *files, err error) {
	f := &files{}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Dir(o.LogPath), 0o700); err != nil {
		return nil, fmt.Errorf("creating log directory: %w", err)
	}
	// Readable: the stack copies the log into the rotated file.
	if f.log, err = os.OpenFile(o.LogPath, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600); err != nil {
		return nil, fmt.Errorf("opening stack log %s: %w", o.LogPath, err)
	}
	if f.rotated, err = os.OpenFile(RotatedLog(o.LogPath), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return nil, fmt.Errorf("opening stack's rotated log %s: %w", RotatedLog(o.LogPath), err)
	}
	if f.ready, f.readyW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("creating readiness pipe: %w", err)
	}
	if o.WireNetns != "" {
		if f.wire, err = os.Open(o.WireNetns); err != nil {
			return nil, fmt.Errorf("opening the stack's namespace %s: %w", o.WireNetns, err)
		}
	}
	if f.netns, err = ns.GetNS(o.Netns); err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", o.Netns, err)
	}
	return f, nil
}

// Close closes what is open; closing twice is harmless.
func (f *files) Close() {
	for _, c := range []*os.File{f.log, f.rotated, f.ready, f.readyW, f.wire} {
		if c != nil {
			c.Close()
		}
	}
	if f.netns != nil {
		f.netns.Close()
	}
}

// command is the process to start, with its descriptors and environment.
func command(o Options, f *files) *exec.Cmd {
	cmd := exec.Command(o.Binary, o.Args...)
	cmd.Stdin = nil
	cmd.Stdout = f.log
	cmd.Stderr = f.log
	// ReadyFD, WireNetnsFD (none without Options.WireNetns), LogRotatedFD.
	cmd.ExtraFiles = []*os.File{f.readyW, f.wire, f.rotated}
	// Its own session: the stack outlives the plugin and must not receive
	// signals aimed at the runtime's process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = stackEnv()
	if f.wire != nil {
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", WireNetnsEnv, WireNetnsFD))
	}
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", LogRotatedEnv, LogRotatedFD))
	return cmd
}

// awaitReady puts the started process in its cgroups and oom_score_adj
// and waits for its readiness line on ready.
func awaitReady(cmd *exec.Cmd, o Options, ready *os.File) (Process, error) {
	pid := cmd.Process.Pid
	adj := o.OOMScoreAdj
	if adj == 0 {
		adj = StackOOMScoreAdj
	}
	warning := setOOMScoreAdj(pid, adj)
	root := o.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	if o.CgroupPath != "" {
		if err := joinCgroup(pid, root, o.CgroupPath); err != nil {
			return Process{}, err
		}
	}
	if len(o.Cgroups) > 0 {
		warning = errors.Join(warning, joinRecorded(pid, root, o.Cgroups))
	}
	line, err := readLine(ready, o.ReadyTimeout)
	if err != nil {
		return Process{}, fmt.Errorf("waiting for the stack to be ready: %w (log: %s)", err, o.LogPath)
	}
	if msg, isErr := strings.CutPrefix(line, "error: "); isErr {
		return Process{}, fmt.Errorf("stack failed to start: %s", msg)
	}
	if line != "ok" {
		return Process{}, fmt.Errorf("stack failed to start (log: %s)", o.LogPath)
	}
	st, err := StartTime(pid)
	if err != nil {
		return Process{}, err
	}
	return Process{PID: pid, StartTime: st, Warning: warning}, nil
}

func readLine(f *os.File, timeout time.Duration) (string, error) {
	if err := f.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("no readiness within %s", timeout)
		}
		return "", fmt.Errorf("stack exited before it was ready")
	}
	return strings.TrimSpace(line), nil
}

// StartTime reads the kernel's start time of pid (clock ticks since boot).
func StartTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// procStat reads the state (field 3) and start time (field 22) of pid.
func procStat(pid int) (state byte, startTime uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; fields
	// after the last ')' are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	startTime, err = strconv.ParseUint(fields[19], 10, 64)
	return fields[0][0], startTime, err
}

// Alive reports whether p is still the same running process (a zombie
// counts as gone).
func Alive(p Process) bool {
	if p.PID <= 0 {
		return false
	}
	state, st, err := procStat(p.PID)
	return err == nil && st == p.StartTime && state != 'Z'
}

// Stop sends SIGTERM to p, waits up to grace for it to exit, then sends
// SIGKILL and waits again. A process that is already gone, or whose PID now
// belongs to another process, is success. The pidfd pins the identity: once
// opened and checked against the start time, no reuse can redirect the
// signal.
func Stop(p Process, grace time.Duration) error {
	if p.PID <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening pidfd of stack %d: %w", p.PID, err)
	}
	defer unix.Close(fd)
	if !Alive(p) {
		return nil
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("signalling stack %d: %w", p.PID, err)
		}
		if exited(fd, p, grace) {
			return nil
		}
	}
	return fmt.Errorf("stack %d did not exit after SIGKILL", p.PID)
}

// exited waits for the process behind fd to exit. The pidfd becomes
// readable when it does, whether or not anyone has reaped it yet.
func exited(fd int, p Process, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return !Alive(p)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == nil && n > 0 {
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return !Alive(p)
		}
	}
}

// stackEnv is the stack's whole environment: PATH as the launcher has it
// (the stack runs no other program: it sets offloads through the ethtool
// ioctl), and GORACE so that a race-instrumented test build halts on a
// race instead of printing it to a log nobody reads.
func stackEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	// CNI_USERNET_SANDBOX=off|log reaches the stack for debugging
	// (docs/reliability/sandbox.md).
	for _, k := range []string{"GORACE", "CNI_USERNET_SANDBOX", "CNI_USERNET_GOGC", "GOMAXPROCS", LogMaxBytesEnv} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Find returns the live processes whose arguments after the program name
// are exactly args: the stack of one attachment, found by its config path
// when the state that recorded its PID is lost. Only processes of the
// node's mount namespace count (see onNode).
func Find(args ...string) []Process {
	var out []Process
	eachProcess(func(p Process, argv []string) {
		if len(argv) == len(args)+1 && slices.Equal(argv[1:], args) && onNode(p.PID) {
			out = append(out, p)
		}
	})
	return out
}

// StackArgs are the arguments after the binary that start (the plugin's
// ADD, the agent's restart) and find (a teardown without state,
// FindStacks) the stack whose configuration is at configPath.
func StackArgs(configPath string) []string { return []string{"stack", "--config", configPath} }

// StackConfigOf is the configuration path of a process whose whole
// command line is argv, when that is a stack's (the binary, then
// StackArgs).
func StackConfigOf(argv []string) (string, bool) {
	if len(argv) != 4 || argv[1] != "stack" || argv[2] != "--config" {
		return "", false
	}
	return argv[3], true
}

// Stack is a running stack process found by its config path.
type Stack struct {
	Process
	ConfigPath string
}

// FindStacks returns the live stack processes ("<bin> stack --config
// PATH") whose config path lies under dir: the node agent finds stacks
// whose state was lost this way. Only processes of the node's mount
// namespace count (see onNode).
func FindStacks(dir string) []Stack {
	dir = filepath.Clean(dir) + "/"
	var out []Stack
	eachProcess(func(p Process, argv []string) {
		if config, ok := StackConfigOf(argv); ok && strings.HasPrefix(config, dir) && onNode(p.PID) {
			out = append(out, Stack{Process: p, ConfigPath: config})
		}
	})
	return out
}

// onNode reports whether process pid runs in the mount namespace of the
// caller or of PID 1 (the node's, to an agent with the host's PID
// namespace): where the plugin and the agent start stacks. A command
// line is anyone's to write, and every container's processes show in the
// node's /proc: a pod's process that calls itself a stack runs in its
// container's mount namespace and is not taken for one, so it neither
// passes for a stack the agent reports and whose directory it keeps, nor
// gets stopped by a DEL that finds stacks by their config path.
func onNode(pid int) bool {
	st, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
	if err != nil {
		return false
	}
	for _, ref := range []string{"/proc/self/ns/mnt", "/proc/1/ns/mnt"} {
		if r, err := os.Stat(ref); err == nil && os.SameFile(st, r) {
			return true
		}
	}
	return false
}

// eachProcess calls f with every live process and its arguments.
func eachProcess(f func(p Process, argv []string)) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		st, err := StartTime(pid)
		if err != nil {
			continue
		}
		if p := (Process{PID: pid, StartTime: st}); Alive(p) {
			f(p, strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"))
		}
	}
}

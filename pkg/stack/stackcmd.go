package stack

// The stack process's command line, start-up, sandbox and readiness
// report: the whole of cni-usernet-stack, the small binary the plugin
// starts for each pod.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	rdebug "runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/stack/logfile"
	"github.com/cni-usernet/cni-usernet/pkg/stack/sandbox"
	gvlog "gvisor.dev/gvisor/pkg/log"
)

// processStart is when the process began, as near as Go lets us see it.
var processStart = time.Now()

// Run is the pod's stack process; argv are the arguments after "stack".
// It reports readiness on launch.ReadyFD when a launcher passed one.
func Run(argv []string) error {
	fs := flag.NewFlagSet("stack", flag.ContinueOnError)
	configPath := fs.String("config", "", "stack configuration file (JSON)")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	log := newLogger(*debug)
	ready := os.NewFile(launch.ReadyFD, "ready")
	report := func(line string) {
		if ready != nil {
			fmt.Fprintln(ready, line)
			ready.Close()
			ready = nil
		}
	}
	if v := os.Getenv("CNI_USERNET_GOGC"); v != "" {
		n, _ := strconv.Atoi(v)
		rdebug.SetGCPercent(n)
	}
	cfg, err := stackconfig.Read(*configPath)
	if err != nil {
		report("error: " + err.Error())
		return err
	}
	log = log.With("ifName", cfg.IfName)
	adaptive := setThreads(cfg)
	sandboxMode, err := sandbox.ModeFromEnv()
	if err != nil {
		report("error: " + err.Error())
		return err
	}
	d, err := Start(*cfg, log)
	if err != nil {
		log.Error("stack failed to start", "err", err)
		report("error: " + err.Error())
		return err
	}
	if adaptive {
		_, governed := cfg.BusyPollWindow()
		d.Govern(stackconfig.AdaptiveMaxThreads(runtime.NumCPU()), governed)
	}
	// Signal handling is set up before the sandbox, like everything else
	// the stack will use while serving.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Every descriptor is open now; from here the process can only use
	// them. A stack that cannot sandbox itself does not serve.
	sb, err := sandbox.Apply(sandboxMode)
	if err != nil {
		err = fmt.Errorf("sandboxing the stack: %w", err)
		log.Error("stack failed to start", "err", err)
		report("error: " + err.Error())
		return err
	}
	d.Startup.Done("sandbox")
	log.Info("stack sandboxed", "sandbox", sb)
	log.Info("stack ready", d.Startup.Attr("startup"), slog.Duration("sinceExec", time.Since(processStart).Round(100*time.Microsecond)))
	report("ok")
	// Starting leaves garbage (the seccomp program's build, netlink
	// dumps) that an idle stack would hold forever: its heap never grows
	// to the next collection. Collecting now and returning the free pages
	// keeps them out of every idle pod's RSS.
	go ReleaseFreeHeap()
	err = d.Run(ctx)
	// The shutdown path runs under the filter too; the tests look for this
	// line to know it completed.
	log.Info("stack stopped")
	return err
}

// newLogger is the stack's log: JSON on stderr, each line with the
// process's ID, through the log's cap (logOutput).
func newLogger(debug bool) *slog.Logger {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(logOutput(), &slog.HandlerOptions{Level: level})).With("pid", os.Getpid())
}

// logOutput is where the stack's log lines go: stderr, which the launcher
// made the log file, capped and rotated into the file it handed over as
// launch.LogRotatedFD, so that what a pod makes its stack log (denials,
// gVisor's warnings) takes a bounded room on the node's disk. Plain
// stderr when started by hand, without that file.
func logOutput() io.Writer {
	v, ok := os.LookupEnv(launch.LogRotatedEnv)
	if !ok {
		return os.Stderr
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		fmt.Fprintf(os.Stderr, "%s=%q: not a descriptor; the log is not capped\n", launch.LogRotatedEnv, v)
		return os.Stderr
	}
	capBytes := int64(logfile.MaxBytes)
	if v := os.Getenv(launch.LogMaxBytesEnv); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			capBytes = n
		}
	}
	w, err := logfile.New(os.Stderr, os.NewFile(uintptr(fd), "rotated log"), capBytes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "capping the log: %v; the log is not capped\n", err)
		return os.Stderr
	}
	// netstack's own warnings, which would go to stderr unbounded.
	gvlog.SetTarget(gvlog.JSONEmitter{Writer: &gvlog.Writer{Next: w}})
	return w
}

// setThreads sets the stack's thread count from cfg, and reports whether
// the count is left to follow the load (Daemon.AdaptThreads). GOMAXPROCS
// in the environment (passed on by the plugin) is for experiments and
// wins over the configuration.
func setThreads(cfg *stackconfig.Config) (adaptive bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return false
	}
	runtime.GOMAXPROCS(max(cfg.Threads, stackconfig.DefaultThreads))
	// The conflist's busy-poll window keeps one thread polling always,
	// by design: a second would spin beside it. Left to the governor (by
	// default, or a pod annotation's window, BusyPollGoverned), busy
	// polling comes with the thread count; without it, it is off
	// (BusyPollOff wins over a governed window): the governor is what
	// turns it off for bulk traffic and a busy node.
	adaptive = cfg.Threads == 0 && cfg.BusyPoll == 0 && runtime.NumCPU() > 1
	if !adaptive && cfg.BusyPoll == 0 {
		cfg.BusyPollOff = true
	}
	return adaptive
}

package stack

// The stack process's command line, start-up, sandbox and readiness
// report: the whole of cni-usernet-stack, the small binary the plugin
// starts for each pod.

import (
	"context"
	"flag"
	"fmt"
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
	"github.com/cni-usernet/cni-usernet/pkg/stack/sandbox"
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
		_, autoPoll := cfg.BusyPollWindow()
		d.Govern(stackconfig.AdaptiveMaxThreads(runtime.NumCPU()), autoPoll)
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
// process's ID.
func newLogger(debug bool) *slog.Logger {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("pid", os.Getpid())
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
	// A fixed busy-poll window keeps one thread polling by design: a
	// second would spin beside it. Left to the governor, busy polling
	// comes with the thread count; without it, it is off: the governor
	// is what turns it off for bulk traffic and a busy node.
	adaptive = cfg.Threads == 0 && cfg.BusyPoll == 0 && runtime.NumCPU() > 1
	if !adaptive && cfg.BusyPoll == 0 {
		cfg.BusyPollOff = true
	}
	return adaptive
}

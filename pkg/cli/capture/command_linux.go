package capture

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/cli/status"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

const captureUsage = `usage: cni-usernet capture [flags] <namespace>/<pod> | <containerID>

Captures a pod's traffic on both legs of its stack and writes pcapng:
  wire  the pod's link (eth0) as the stack sees it
  app   the pod's own kernel: loopback between the stack and the
        applications (the pod's own 127.0.0.1 traffic left out), and the TUN

  cni-usernet capture default/web | tcpdump -nn -e -r -
  cni-usernet capture -w web.pcapng -c 100 --leg app default/web

flags:
`

// Run is `cni-usernet capture`: it finds the pod's running stack, asks it
// where and what to capture, and records to stdout or -w's file until
// the count, the duration or an interrupt.
func Run(argv []string, stdout, stderr io.Writer) error {
	f, err := parseCaptureFlags(argv, stderr)
	if err != nil {
		return err
	}
	a, err := findRunningAttachment(f.stateDir, f.target, f.ifName)
	if err != nil {
		return err
	}
	o := f.opts
	if err := fromStack(&o, a); err != nil {
		return err
	}
	if o.App {
		if restore := redirectToTCP(a, stderr); restore != nil {
			defer restore()
		}
	}
	file, err := openCaptureOutput(f.out, stdout)
	if err != nil {
		return err
	}
	o.Out = stdout
	if file != nil {
		defer file.Close()
		o.Out = file
	}
	// A reader that goes away (tcpdump -c) makes writes fail with EPIPE
	// instead of killing the process, so that the summary is printed and
	// the stack told to stop.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	o.Started = func(ifaces []pcap.Interface) {
		// tcpdump prints the node's name of an interface index; these
		// are the pod's.
		var legs []string
		for _, i := range ifaces {
			legs = append(legs, fmt.Sprintf("%s %s (ifindex %d)", i.Leg, i.Name, i.IfIndex))
		}
		fmt.Fprintf(stderr, "cni-usernet capture: capturing %s: %s\n", describe(a), strings.Join(legs, ", "))
	}
	sum, err := Record(ctx, o)
	printSummary(stderr, sum)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if file != nil {
		if err := file.Close(); err != nil {
			return fmt.Errorf("capture: %w", err)
		}
	}
	return nil
}

// captureFlags are the command line of capture.
type captureFlags struct {
	target, out, ifName, stateDir string
	// opts holds the count, duration, snap length and legs.
	opts Options
}

func parseCaptureFlags(argv []string, stderr io.Writer) (captureFlags, error) {
	fs := flag.NewFlagSet("capture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, captureUsage)
		fs.PrintDefaults()
	}
	var f captureFlags
	fs.StringVar(&f.out, "w", "", "write to this file instead of stdout")
	leg := fs.String("leg", "both", "legs to capture: wire, app or both")
	fs.IntVar(&f.opts.Count, "c", 0, "stop after this many packets (0: no limit)")
	fs.DurationVar(&f.opts.Duration, "duration", 0, "stop after this long, e.g. 30s (0: until interrupted)")
	fs.IntVar(&f.opts.SnapLen, "s", pcap.DefaultSnapLen, "bytes of each packet kept")
	fs.StringVar(&f.ifName, "if", "", "the pod's interface, when it has several attachments")
	fs.StringVar(&f.stateDir, "state-dir", netconf.DefaultStateDir, "state directory of the plugin")
	if err := fs.Parse(argv); err != nil {
		return f, err
	}
	// Flags may also follow the pod, as with kubectl.
	f.target = fs.Arg(0)
	if fs.NArg() > 1 {
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return f, err
		}
		if fs.NArg() > 0 {
			return f, fmt.Errorf("capture: one pod at a time, got %q and %q", f.target, fs.Arg(0))
		}
	}
	if f.target == "" {
		fs.Usage()
		return f, fmt.Errorf("capture: which pod?")
	}
	switch *leg {
	case "wire":
		f.opts.Wire = true
	case "app":
		f.opts.App = true
	case "both":
		f.opts.Wire, f.opts.App = true, true
	default:
		return f, fmt.Errorf("capture: --leg %q: want wire, app or both", *leg)
	}
	return f, nil
}

// findRunningAttachment finds target's attachment in stateDir and checks
// that its stack runs.
func findRunningAttachment(stateDir, target, ifName string) (*state.Attachment, error) {
	atts, errs := state.Store{Dir: stateDir}.List()
	if len(atts) == 0 && len(errs) > 0 {
		if errors.Is(errs[0], iofs.ErrPermission) {
			return nil, fmt.Errorf("capture: %w (capturing needs root on the node)", errs[0])
		}
		return nil, errs[0]
	}
	a, err := findAttachment(atts, target, ifName)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if !launch.Alive(launch.Process{PID: a.StackPID, StartTime: a.StackStartTime}) {
		return nil, fmt.Errorf("capture: the stack of %s (pid %d) is not running; `cni-usernet status` says why", describe(a), a.StackPID)
	}
	return a, nil
}

// redirectToTCP sends the pod's redirected connections through TCP for
// the capture, where its app leg sees them (the socket redirect hands
// their messages from socket to socket otherwise); restore turns that
// off again. Connections that went through TCP stay there. nil: the pod
// has no redirect.
func redirectToTCP(a *state.Attachment, stderr io.Writer) (restore func()) {
	r := a.SocketRedirect
	if r == nil || !r.On {
		return nil
	}
	node, err := sockmap.Open(r.BPFDir)
	if err != nil {
		fmt.Fprintf(stderr, "cni-usernet capture: the socket redirect's programs: %v; what the pod's applications send to the stack may be missing from the app leg\n", err)
		return nil
	}
	if err := node.SetCapture(r.NetnsCookie, true); err != nil {
		node.Close()
		fmt.Fprintf(stderr, "cni-usernet capture: %v; what the pod's applications send to the stack may be missing from the app leg\n", err)
		return nil
	}
	fmt.Fprintln(stderr, "cni-usernet capture: the pod's loopback connections go through TCP while capturing, and stay there")
	return func() {
		node.SetCapture(r.NetnsCookie, false)
		node.Close()
	}
}

// fromStack fills in o where and what to capture, from a's record and its
// stack's status.
func fromStack(o *Options, a *state.Attachment) error {
	var st control.Status
	if err := control.FetchStatus(a.ControlSocket, 5*time.Second, &st); err != nil {
		if errors.Is(err, iofs.ErrPermission) {
			return fmt.Errorf("capture: %w (the control socket is root's only: capturing needs root on the node)", err)
		}
		return fmt.Errorf("capture: %w", err)
	}
	o.ControlSocket = a.ControlSocket
	// The stack lives in the pod's network namespace: its /proc entry
	// names it even when the runtime's netns path is gone.
	o.Netns = fmt.Sprintf("/proc/%d/ns/net", a.StackPID)
	o.WireDevice = st.IfName
	o.AppDevices = []string{"lo", st.TUNName}
	if st.Spec != nil {
		for _, p := range st.Spec.Addrs {
			o.PodIPs = append(o.PodIPs, p.Addr())
		}
	}
	if len(o.PodIPs) == 0 {
		for _, ip := range a.IPs {
			if p, err := netip.ParsePrefix(ip); err == nil {
				o.PodIPs = append(o.PodIPs, p.Addr())
			}
		}
	}
	return nil
}

// openCaptureOutput creates the file path; with no path it returns nil
// for stdout, which must not be a terminal.
func openCaptureOutput(path string, stdout io.Writer) (*os.File, error) {
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		return f, nil
	}
	if f, ok := stdout.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return nil, fmt.Errorf("capture: not writing pcap to a terminal: pipe it (| tcpdump -nn -e -r -) or use -w FILE")
		}
	}
	return nil, nil
}

func describe(a *state.Attachment) string {
	if a.PodName != "" {
		return fmt.Sprintf("pod %s/%s (container %s, %s)", a.PodNS, a.PodName, status.ShortID(a.ContainerID), a.IfName)
	}
	return fmt.Sprintf("container %s (%s)", status.ShortID(a.ContainerID), a.IfName)
}

// findAttachment resolves <namespace>/<pod> (what the runtime passed in
// CNI_ARGS) or a container ID or its prefix.
func findAttachment(atts []*state.Attachment, target, ifName string) (*state.Attachment, error) {
	var found []*state.Attachment
	ns, name, byPod := strings.Cut(target, "/")
	for _, a := range atts {
		if ifName != "" && a.IfName != ifName {
			continue
		}
		if byPod && a.PodNS == ns && a.PodName == name || !byPod && strings.HasPrefix(a.ContainerID, target) {
			found = append(found, a)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no attachment of %q on this node (`cni-usernet status` lists them)", target)
	case 1:
		return found[0], nil
	}
	var names []string
	for _, a := range found {
		names = append(names, status.ShortID(a.ContainerID)+"/"+a.IfName)
	}
	return nil, fmt.Errorf("%q names %d attachments (%s): give a longer container ID or --if", target, len(found), strings.Join(names, ", "))
}

func printSummary(w io.Writer, s Summary) {
	var parts []string
	for _, i := range s.Ifaces {
		parts = append(parts, fmt.Sprintf("%s (%s) %d", i.Name, i.Leg, i.Written))
	}
	how := ""
	if s.CountReached {
		how = ", the count reached"
	}
	fmt.Fprintf(w, "cni-usernet capture: %d packets written%s: %s\n", s.Written(), how, strings.Join(parts, ", "))
	if n := s.Dropped(); n == 0 {
		fmt.Fprintln(w, "cni-usernet capture: 0 packets dropped")
	} else {
		parts = parts[:0]
		for _, i := range s.Ifaces {
			if i.Dropped > 0 {
				parts = append(parts, fmt.Sprintf("%s (%s): %s", i.Name, i.Leg, i.DroppedWhere))
			}
		}
		fmt.Fprintf(w, "cni-usernet capture: %d packets DROPPED because the reader was too slow (the pod's traffic was not held up): %s\n",
			n, strings.Join(parts, "; "))
	}
	if s.Incomplete != "" {
		fmt.Fprintln(w, "cni-usernet capture: counts may be short:", s.Incomplete)
	}
}

// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/stack/busypoll"
	"github.com/cni-usernet/cni-usernet/pkg/stack/governor"
)

// TestBusyPollAnnotationIsGoverned follows a busy-poll window from the
// conflist or a pod's annotation, through the stack configuration the
// plugin writes and the stack reads, to the stack's poller and governor
// as Run wires them, with the governor's samples injected: the
// annotation's window stays off on a node with no idle CPU (and goes on,
// with its own length, on a node with idle), the conflist's is on
// whatever the node's load.
func TestBusyPollAnnotationIsGoverned(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("the governor runs only on nodes of two CPUs or more")
	}
	// setThreads honours GOMAXPROCS from the environment, and sets the
	// process's.
	t.Setenv("GOMAXPROCS", "")
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })

	annotated := map[string]any{"runtimeConfig": map[string]any{netconf.PodAnnotationsCapability: map[string]any{netconf.AnnotationBusyPoll: "500us"}}}
	for _, c := range []struct {
		name string
		conf map[string]any
		idle bool // the node had idle CPU
		// on: busy polling went on; always: it never went off (the
		// governor's probes turn a governed window off at times).
		on, always bool
	}{
		{"annotation on a busy node", annotated, false, false, false},
		{"annotation over the conflist's window on a busy node", map[string]any{"busyPoll": "50us", "runtimeConfig": annotated["runtimeConfig"]}, false, false, false},
		{"annotation on an idle node", annotated, true, true, false},
		{"conflist on a busy node", map[string]any{"busyPoll": "500us"}, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			busy, g, sample := wireBusyPoll(t, c.conf)
			wentOn := false
			for i := range 20 {
				// Requests on one thread: small frames both ways, the
				// stack at 0.6 core; the rest of the node at 0.2 core
				// (idle) or all the rest of its two CPUs (busy), tasks
				// waiting a tenth of the time.
				others := 1.4
				if c.idle {
					others = 0.2
				}
				sample.CPU += 60 * time.Millisecond
				sample.RxFrames, sample.RxBytes = sample.RxFrames+3000, sample.RxBytes+3000*120
				sample.TxFrames, sample.TxBytes = sample.TxFrames+3000, sample.TxBytes+3000*90
				sample.NodeBusy += time.Duration((others + 0.6) * float64(governor.DefaultInterval))
				sample.NodeWait += governor.DefaultInterval / 10
				if g != nil {
					g.Tick()
				}
				switch on := busy.Enabled(); {
				case on && !c.on:
					t.Fatalf("interval %d: busy polling on with a %s window on a node with no idle CPU", i, busy.Window())
				case !on && c.always:
					t.Fatalf("interval %d: busy polling off with the conflist's window", i)
				case on:
					wentOn = true
				}
			}
			if wentOn != c.on {
				t.Errorf("busy polling went on: got %v, want %v", wentOn, c.on)
			}
			if busy.Window() != 500*time.Microsecond {
				t.Errorf("window: got %s, want 500µs", busy.Window())
			}
		})
	}
}

// wireBusyPoll builds what Run builds for a pod of the given conflist
// keys: the stack configuration the plugin writes, read back, the
// thread count (setThreads), the poller podstack.Build makes from
// BusyPollWindow (started off when governed, as Start asks), and, when
// the count is left to the load, the governor Govern makes, reading the
// returned sample. The poller is never started: nothing spins.
func wireBusyPoll(t *testing.T, keys map[string]any) (*busypoll.Poller, *governor.Governor, *governor.Sample) {
	t.Helper()
	conf := map[string]any{"cniVersion": "1.1.0", "name": "net", "type": "cni-usernet"}
	for k, v := range keys {
		conf[k] = v
	}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := netconf.Parse(b)
	if err != nil {
		t.Fatalf("parsing %s: %v", b, err)
	}
	sc := nc.StackConfig("eth0", offload.ModeHardware, netconf.StackFiles{Spec: "/s", ControlSocket: "/c"})
	if b, err = json.Marshal(sc); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := stackconfig.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	adaptive := setThreads(cfg)
	window, governed := cfg.BusyPollWindow()
	busy, err := busypoll.New(window)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(busy.Close)
	busy.SetEnabled(!governed)
	sample := &governor.Sample{}
	var g *governor.Governor
	if adaptive {
		g = newGovernor(stackconfig.AdaptiveMaxThreads(2), governor.DefaultInterval, func() governor.Sample { return *sample }, busy, governed, 2)
	}
	return busy, g, sample
}

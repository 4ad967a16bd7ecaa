package nodeagent

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/state"
	"github.com/cni-usernet/cni-usernet/test/nettest"
)

// drainNode is an agent whose DaemonSet is gone, outside a cluster (no
// DaemonSet check), with its state and run directories in t's temp dirs.
func drainNode(t *testing.T) (*nodeInstall, state.Store, *nettest.LockedBuffer) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	f := &agentFlags{stateDir: t.TempDir(), runDir: t.TempDir()}
	return &nodeInstall{f: f}, state.Store{Dir: f.stateDir}, &nettest.LockedBuffer{}
}

func TestDrainWaitsForTheLastAttachment(t *testing.T) {
	n, store, logs := drainNode(t)
	log := slog.New(slog.NewTextHandler(logs, nil))
	for _, a := range []*state.Attachment{
		{ContainerID: "c1", IfName: "eth0", PodNS: "team", PodName: "web-0"},
		{ContainerID: "c2", IfName: "eth0", PodNS: "team", PodName: "web-1"},
	} {
		if err := store.Save(a); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan bool, 1)
	go func() { done <- n.drain(log) }()
	select {
	case <-done:
		t.Fatal("drain returned while pods still have attachments")
	case <-time.After(1500 * time.Millisecond):
	}
	if s := logs.String(); !strings.Contains(s, "uninstall deferred") || !strings.Contains(s, "team/web-0, team/web-1") {
		t.Errorf("log does not name the pods waited for:\n%s", s)
	}
	store.Delete("c1", "eth0")
	select {
	case <-done:
		t.Fatal("drain returned with one attachment left")
	case <-time.After(1500 * time.Millisecond):
	}
	store.Delete("c2", "eth0")
	select {
	case ok := <-done:
		if !ok {
			t.Error("drain gave up instead of uninstalling")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not return after the last attachment went")
	}
}

func TestDrainNothingAttached(t *testing.T) {
	n, _, logs := drainNode(t)
	if !n.drain(slog.New(slog.NewTextHandler(logs, nil))) {
		t.Error("drain with no attachments did not proceed")
	}
	if strings.Contains(logs.String(), "deferred") {
		t.Errorf("nothing to wait for, yet: %s", logs.String())
	}
}

func TestDrainDroppedWhenAnotherAgentIsReady(t *testing.T) {
	n, store, logs := drainNode(t)
	store.Save(&state.Attachment{ContainerID: "c1", IfName: "eth0", PodNS: "team", PodName: "web-0"})
	// A new agent (this process stands in for it) is ready on the node.
	if err := markReady(n.f.readyFile()); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- n.drain(slog.New(slog.NewTextHandler(logs, nil))) }()
	select {
	case ok := <-done:
		if ok {
			t.Error("drain proceeded to uninstall under a ready agent")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not notice the ready agent")
	}
}

// The conflist's plugin entry asks ADD to wait for the pod's policy when
// the agent enforces it, in both modes; --network-policy=false leaves the
// key out (the primary CNI enforces policy).
func TestPluginConfNetworkPolicy(t *testing.T) {
	f, err := parseAgentFlags(nil)
	if err != nil || !f.networkPolicy {
		t.Fatalf("--network-policy default: got %v (%v), want true", f.networkPolicy, err)
	}
	for _, mode := range []string{"standalone", "chain"} {
		for _, on := range []bool{true, false} {
			f, err := parseAgentFlags([]string{"--mode", mode, "--subnet", "10.244.1.0/24", "--network-policy=" + strconv.FormatBool(on)})
			if err != nil {
				t.Fatal(err)
			}
			b, err := (&nodeInstall{f: f}).pluginConf(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var p map[string]any
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatal(err)
			}
			if got, ok := p["networkPolicy"]; on && got != true || !on && ok {
				t.Errorf("%s, --network-policy=%v: networkPolicy is %v (present %v)", mode, on, got, ok)
			}
		}
	}
}

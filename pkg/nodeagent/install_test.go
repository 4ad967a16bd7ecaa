package nodeagent

import (
	"log/slog"
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

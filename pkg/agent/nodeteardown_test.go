package agent

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// drainNode is an agent whose DaemonSet is gone, outside a cluster (no
// DaemonSet check), with its state and run directories in t's temp dirs.
func drainNode(t *testing.T) (*nodeSetup, state.Store, *nettest.LockedBuffer) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	f := &agentFlags{stateDir: t.TempDir(), runDir: t.TempDir()}
	return &nodeSetup{f: f}, state.Store{Dir: f.stateDir}, &nettest.LockedBuffer{}
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

// TestDrainDroppedWhenANewerAgentStarts: an agent started on the node
// (the manifest applied again) claims it before it installs anything or is
// ready; the deferred uninstall sees that claim and is dropped, also
// when the last pod is gone by then (uninstalling would remove what the
// newer agent installs). Its own claim, or one of a process that is gone,
// does not count.
func TestDrainDroppedWhenANewerAgentStarts(t *testing.T) {
	n, store, logs := drainNode(t)
	log := slog.New(slog.NewTextHandler(logs, nil))
	store.Save(&state.Attachment{ContainerID: "c1", IfName: "eth0", PodNS: "team", PodName: "web-0"})
	if err := markReady(n.f.claimFile()); err != nil { // this agent's own claim
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- n.drain(log) }()
	select {
	case <-done:
		t.Fatal("drain returned on the agent's own claim")
	case <-time.After(1500 * time.Millisecond):
	}
	// A process of the newer agent (a sleep stands in for it).
	newer := exec.Command("sleep", "60")
	if err := newer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { newer.Process.Kill(); newer.Wait() })
	st, err := launch.StartTime(newer.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(n.f.claimFile(), []byte(fmt.Sprintf("%d %d\n", newer.Process.Pid, st)), 0o600); err != nil {
		t.Fatal(err)
	}
	store.Delete("c1", "eth0") // the last pod goes too
	select {
	case ok := <-done:
		if ok {
			t.Error("drain proceeded to uninstall under a newer agent")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not notice the newer agent's claim")
	}
	if s := logs.String(); !strings.Contains(s, "another agent started on this node") || !strings.Contains(s, fmt.Sprint(newer.Process.Pid)) {
		t.Errorf("log does not say why the uninstall was dropped:\n%s", s)
	}

	// Once that process is gone, its claim no longer counts.
	newer.Process.Kill()
	newer.Wait()
	if !n.drain(log) {
		t.Error("drain with no attachments and a dead claimant did not proceed")
	}
}

// TestReleaseClaim: a completed uninstall removes this agent's claim on
// the node, and leaves another agent's.
func TestReleaseClaim(t *testing.T) {
	claim := filepath.Join(t.TempDir(), "agent.pid")
	if err := markReady(claim); err != nil {
		t.Fatal(err)
	}
	releaseClaim(claim)
	if _, err := os.Stat(claim); !os.IsNotExist(err) {
		t.Errorf("this agent's claim is still there after its release: %v", err)
	}
	other := []byte(fmt.Sprintf("%d 1\n", os.Getpid()+1))
	if err := atomicfile.Write(claim, other, 0o600); err != nil {
		t.Fatal(err)
	}
	releaseClaim(claim)
	if b, err := os.ReadFile(claim); err != nil || string(b) != string(other) {
		t.Errorf("another agent's claim was not left alone: %q, %v", b, err)
	}
}

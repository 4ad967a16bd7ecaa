package nettest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Agent is a node agent (cni-usernet-agent) running in the env's node
// namespace, as the DaemonSet's agent runs in the node's host network,
// supervising the env's state directory without installing anything (the
// test is the runtime).
type Agent struct {
	t    testing.TB
	env  *Env
	cmd  *exec.Cmd
	done chan struct{}
	args []string
	log  LockedBuffer
}

// StartAgent starts an agent with extra arguments, waits until it is
// ready (its first reconcile done), and stops it when the test ends,
// printing its log if the test failed.
func (e *Env) StartAgent(t testing.TB, extra ...string) *Agent {
	t.Helper()
	a := &Agent{t: t, env: e, args: append([]string{
		"--install=false",
		"--state-dir", filepath.Join(e.Dir, "state"),
		"--run-dir", filepath.Join(e.Dir, "agent"),
		"--cni-path", e.BinDir,
		"--mount-ns", "",
	}, extra...)}
	a.Start()
	t.Cleanup(func() {
		a.Stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Output())
		}
	})
	return a
}

// PID is the running agent's process ID (0 when stopped).
func (a *Agent) PID() int {
	if a.cmd == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

// Output is everything the agent wrote so far, across restarts.
func (a *Agent) Output() string { return a.log.String() }

// Start starts the agent (again, after Stop) and waits until it is ready.
func (a *Agent) Start() {
	a.t.Helper()
	cmd := exec.Command(filepath.Join(a.env.BinDir, "cni-usernet-agent"), a.args...)
	cmd.Stdout, cmd.Stderr = &a.log, &a.log
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}
	if err := In(a.env.Node, cmd.Start); err != nil {
		a.t.Fatalf("starting agent: %v", err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(a.done)
	ready := filepath.Join(a.env.Dir, "agent", "agent.ready")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		select {
		case <-a.done:
			a.t.Fatalf("agent exited before it was ready:\n%s", a.Output())
		default:
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("agent not ready after 20s:\n%s", a.Output())
		}
	}
}

// Stop sends sig and waits for the agent to exit, killing it after 10 s.
func (a *Agent) Stop(sig syscall.Signal) {
	if a.cmd == nil {
		return
	}
	a.cmd.Process.Signal(sig)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-a.done
	}
	a.cmd = nil
}

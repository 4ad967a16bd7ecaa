package rig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// Proc is a long-running server the rig started.
type Proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
}

// Pid is the server's process ID, also its process group's.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Log is the path of the server's log.
func (p *Proc) Log() string { return p.log }

// Done is closed when the server has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Command builds argv to run inside namespace ns ("" for the current one),
// in its own process group so that everything it forks can be ended. The
// CNI role enters the namespace with nsenter, in this mount namespace: ip
// netns exec gives its command a mount namespace of its own, where the
// plugin's pin of a stack's namespace would vanish with the command.
func Command(ctx context.Context, ns string, argv ...string) *exec.Cmd {
	switch {
	case ns != "" && len(argv) > 1 && argv[1] == "cni":
		argv = append([]string{"nsenter", "--net=/var/run/netns/" + ns}, argv...)
	case ns != "":
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // a grandchild holding our pipes must not hang us
	return cmd
}

// Output runs argv in ns, bounded by timeout, and returns its stdout.
func Output(ctx context.Context, timeout time.Duration, ns string, argv ...string) ([]byte, error) {
	out, _, err := OutputCPU(ctx, timeout, ns, argv...)
	return out, err
}

// OutputCPU is Output that also returns the CPU seconds, user and system,
// the command used, with the children it waited for: a load generator's
// own share of a workload's CPU. `ip netns exec` execs the command in its
// own process, so the time is the command's.
func OutputCPU(ctx context.Context, timeout time.Duration, ns string, argv ...string) ([]byte, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := Command(ctx, ns, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var cpu float64
	if ps := cmd.ProcessState; ps != nil {
		cpu = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		return stdout.Bytes(), cpu, fmt.Errorf("%s: %w: %s", shortCmd(argv), err, runlog.Tail(stderr.String()+stdout.String(), 600))
	}
	return stdout.Bytes(), cpu, nil
}

func shortCmd(argv []string) string {
	s := strings.Join(argv, " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// Start launches a server in ns, logging to <logs>/<name>.log.
func (r *Rig) Start(ns, name string, argv ...string) (*Proc, error) {
	p := &Proc{log: filepath.Join(r.logs, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p.cmd = Command(context.Background(), ns, argv...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.procs[p] = true
	r.mu.Unlock()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// Stop ends a server and everything in its process group; nil is a server
// that lives as long as its pod (runsc's).
func (r *Rig) Stop(p *Proc) {
	if p == nil {
		return
	}
	r.mu.Lock()
	delete(r.procs, p)
	r.mu.Unlock()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // workers that outlived their master
}

// WaitListen waits until something listens on TCP port in ns (checked with
// ss inside the namespace, so no probe connection disturbs the server).
func WaitListen(ctx context.Context, p *Proc, ns string, port int) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			raw, _ := os.ReadFile(p.log)
			return fmt.Errorf("server exited: %s", runlog.Tail(string(raw), 600))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		out, err := Output(ctx, 5*time.Second, ns, "ss", "-Htln", "sport", "=", fmt.Sprintf(":%d", port))
		if err == nil && len(bytes.TrimSpace(out)) > 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("server did not listen within 15s")
}

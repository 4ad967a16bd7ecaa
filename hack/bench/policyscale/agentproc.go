package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// agentCommand is how a build runs the node agent: cni-usernet-agent when
// the build has that binary (cmd/cni-usernet-agent), else `cni-usernet
// agent`.
func agentCommand(binDir string) ([]string, error) {
	if p := filepath.Join(binDir, "cni-usernet-agent"); isExec(p) {
		return []string{p}, nil
	}
	if p := filepath.Join(binDir, "cni-usernet"); isExec(p) {
		return []string{p, "agent"}, nil
	}
	return nil, fmt.Errorf("%s holds neither cni-usernet-agent nor cni-usernet", binDir)
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

var flagName = regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)

// agentFlags are the flags the agent's usage lists: a flag this harness
// would like to pass but the build does not know is left out, not fatal.
func agentFlags(cmd []string) (map[string]bool, error) {
	c := exec.Command(cmd[0], append(cmd[1:], "-h")...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.Run() // -h exits 2 after printing the usage
	flags := map[string]bool{}
	for _, m := range flagName.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	if !flags["node-name"] || !flags["state-dir"] {
		return nil, fmt.Errorf("%s -h lists no --node-name and --state-dir: %.300s", strings.Join(cmd, " "), out.String())
	}
	return flags, nil
}

// agentOptions are what one agent run is given.
type agentOptions struct {
	cmd              []string
	stateDir, runDir string
	apiHost, apiPort string
	logPath          string
}

// agentProc is a running agent.
type agentProc struct {
	cmd     *exec.Cmd
	started time.Time
	log     *os.File
	done    chan struct{}
	err     error // the exit, once done is closed
	// pprofAddr is where the agent serves its profiles; empty: a build
	// without them.
	pprofAddr string
}

func startAgent(o agentOptions) (*agentProc, error) {
	known, err := agentFlags(o.cmd)
	if err != nil {
		return nil, err
	}
	args := append([]string(nil), o.cmd[1:]...)
	args = append(args, "--install=false", "--node-name="+nodeName, "--state-dir="+o.stateDir, "--run-dir="+o.runDir)
	// Off where the build can switch them off: the metrics listener, the
	// routes to other nodes (they would touch the namespace's routing),
	// and restarts in another mount namespace (nothing is restarted).
	for _, f := range []string{"--metrics-address=", "--node-routes=false", "--mount-ns="} {
		name, _, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if known[name] {
			args = append(args, f)
		}
	}
	// Profiles where the build serves them: the live heap after a
	// collection says what the agent keeps, which its RSS (pages the
	// runtime has not yet handed back) does not.
	var pprofAddr string
	if known["pprof-address"] {
		if pprofAddr, err = freeLoopbackPort(); err != nil {
			return nil, err
		}
		args = append(args, "--pprof-address="+pprofAddr)
	}
	lf, err := os.Create(o.logPath)
	if err != nil {
		return nil, err
	}
	c := exec.Command(o.cmd[0], args...)
	c.Stdout, c.Stderr = lf, lf
	c.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
		"KUBERNETES_SERVICE_HOST=" + o.apiHost, "KUBERNETES_SERVICE_PORT=" + o.apiPort,
		"NODE_NAME=" + nodeName, "POD_NAMESPACE=kube-system"}
	// The Go runtime's knobs pass through, to measure the agent's memory
	// under a collector setting (GOGC=50, GOMEMLIMIT=250MiB) without a build.
	for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, ok := os.LookupEnv(k); ok {
			c.Env = append(c.Env, k+"="+v)
		}
	}
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(lf, "# %s %s\n", o.cmd[0], strings.Join(args, " "))
	if err := c.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	p := &agentProc{cmd: c, started: time.Now(), log: lf, done: make(chan struct{}), pprofAddr: pprofAddr}
	go func() { p.err = c.Wait(); close(p.done) }()
	return p, nil
}

func (p *agentProc) pid() int { return p.cmd.Process.Pid }

// exited says why the agent is gone; nil while it runs.
func (p *agentProc) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return errors.New("the agent exited")
		}
		return fmt.Errorf("the agent exited: %w", p.err)
	default:
		return nil
	}
}

// stop ends the agent: SIGTERM, then SIGKILL after 10 s.
func (p *agentProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
}

// cpuSample is the agent's CPU time at a moment: utime+stime from
// /proc/PID/stat (clock ticks: 10 ms each), and the sum of its threads'
// run time from /proc/PID/task/*/schedstat (nanoseconds), which decides
// when an event has settled: ticks are too coarse to tell a few
// milliseconds of work from none.
type cpuSample struct {
	at      time.Time
	ticks   uint64
	schedNS uint64
}

// clockTick is USER_HZ, fixed at 100 by Linux's ABI on the architectures
// this runs on.
const clockTick = 10 * time.Millisecond

func (p *agentProc) sample() (cpuSample, error) {
	s := cpuSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return s, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, errors.New("malformed /proc/PID/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return s, errors.New("short /proc/PID/stat")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return s, err
	}
	s.ticks = ut + st
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", p.pid()))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // a thread gone since the glob
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseUint(f[0], 10, 64)
			s.schedNS += v
		}
	}
	return s, nil
}

// memory is the agent's VmRSS and VmHWM in MiB.
func (p *agentProc) memory() (rss, hwm float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		}
	}
	return rss, hwm, nil
}

func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a port for the agent's profiles: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// heapProfile saves the agent's heap profile, taken after a collection,
// to path and returns its live heap (HeapAlloc) in MiB; 0 and no file for
// a build that serves no profiles.
func (p *agentProc) heapProfile(path string) (float64, error) {
	if p.pprofAddr == "" {
		return 0, nil
	}
	get := func(query string) ([]byte, error) {
		resp, err := http.Get("http://" + p.pprofAddr + "/debug/pprof/heap?" + query)
		if err != nil {
			return nil, fmt.Errorf("the agent's heap profile: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("the agent's heap profile: %s", resp.Status)
		}
		return b, err
	}
	b, err := get("gc=1")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return 0, err
	}
	// The text form ends with the runtime's MemStats, HeapAlloc among them.
	if b, err = get("debug=1"); err != nil {
		return 0, err
	}
	m := heapAlloc.FindSubmatch(b)
	if m == nil {
		return 0, errors.New("the agent's heap profile has no HeapAlloc")
	}
	n, err := strconv.ParseFloat(string(m[1]), 64)
	return n / (1 << 20), err
}

var heapAlloc = regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)`)

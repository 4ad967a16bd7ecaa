// Package sandbox holds the root tests of the stack's sandbox: a pod
// attached through the real plugin, its stack process inspected in /proc
// and driven with traffic, status and profiles while the sandbox holds.
package sandbox

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/stack/sandbox"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

const cniVersion = "1.1.0"

// TestSandboxedStack attaches a pod and checks that its stack runs
// sandboxed (every thread: no capability in any set, no_new_privs, one
// seccomp filter) and still does all of its work: HTTP both ways, ping
// both ways, /status, a CPU and a heap profile, and a clean SIGTERM
// shutdown. It runs for the binary the tests build (cgo linked, so the
// capability drop goes through the signal broadcast) and for one built
// like the release, CGO_ENABLED=0 (AllThreadsSyscall).
func TestSandboxedStack(t *testing.T) {
	for _, build := range []string{"test-build", "CGO_ENABLED=0"} {
		t.Run(build, func(t *testing.T) {
			env := nettest.NewEnv(t)
			if build == "CGO_ENABLED=0" {
				env.BinDir = noCgoBinDir(t, env.BinDir)
			}
			checkSandboxedStack(t, env)
		})
	}
}

func checkSandboxedStack(t *testing.T, env *nettest.Env) {
	pod := env.NewPod(env.Conf(cniVersion, nil))
	att, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatalf("loading state of %s: %v", pod.ID, err)
	}
	pid := att.StackPID

	threads, err := sandbox.ReadThreads(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(threads) < 2 {
		t.Fatalf("stack %d has %d threads, want several", pid, len(threads))
	}
	for _, th := range threads {
		if !th.Unprivileged() || th.NoNewPrivs != 1 || th.Seccomp != 2 || th.SeccompCount != 1 {
			t.Errorf("stack thread %d: got %+v, want no capability but CAP_NET_RAW and CAP_NET_BIND_SERVICE (permitted, effective, bounding), NoNewPrivs 1, Seccomp 2 with 1 filter", th.TID, th)
		}
	}
	logText := func() string {
		b, err := os.ReadFile(att.LogPath)
		if err != nil {
			t.Fatalf("reading stack log: %v", err)
		}
		return string(b)
	}
	sandboxed := ""
	for _, line := range strings.Split(logText(), "\n") {
		if strings.Contains(line, `"msg":"stack sandboxed"`) {
			sandboxed = line
		}
	}
	if !strings.Contains(sandboxed, `"mode":"on"`) {
		t.Errorf("stack log: got sandboxed line %q, want one in mode on", sandboxed)
	}
	t.Log(sandboxed)

	nettest.ServeRemoteAddr(t, nettest.Listen(t, pod.NS, "tcp", ":8080"))
	nettest.ServeRemoteAddr(t, nettest.Listen(t, env.Node, "tcp", ":8081"))
	for _, fam := range []int{4, 6} {
		if got, want := nettest.GetPeer(t, env.Node, pod.IP(fam), 8080), pod.Gateway(fam); got != want {
			t.Errorf("IPv%d node→pod: pod saw client %s, want %s", fam, got, want)
		}
		if got, want := nettest.GetPeer(t, pod.NS, pod.Gateway(fam), 8081), pod.IP(fam); got != want {
			t.Errorf("IPv%d pod→node: node saw client %s, want %s", fam, got, want)
		}
	}
	nettest.PingBothWays(t, env.Node, pod)

	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 5*time.Second, &st); err != nil {
		t.Fatal(err)
	}
	if st.PID != pid || st.Relay.TCPTotal < 4 {
		t.Errorf("status: got pid %d with %d relayed TCP connections, want pid %d and at least 4", st.PID, st.Relay.TCPTotal, pid)
	}
	// The CPU profile needs SIGPROF, setitimer and per-thread timers; the
	// heap profile's reading of /proc/self/maps is denied and the profile
	// comes without mappings, which it tolerates.
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/heap"} {
		prof := getControl(t, att.ControlSocket, path)
		zr, err := gzip.NewReader(bytes.NewReader(prof))
		if err != nil {
			t.Errorf("%s: got %d bytes that are not gzip: %v: %.200q", path, len(prof), err, prof)
			continue
		}
		raw, err := io.ReadAll(zr)
		if err != nil || !bytes.Contains(raw, []byte("nanoseconds")) && !bytes.Contains(raw, []byte("bytes")) {
			t.Errorf("%s: got %d bytes of profile, %v; want a pprof protobuf", path, len(raw), err)
		}
	}

	// Shutdown runs under the filter too: it must complete, not hang or
	// die on a denied call.
	proc := launch.Process{PID: pid, StartTime: att.StackStartTime}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); launch.Alive(proc); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("stack still alive 10s after SIGTERM")
		}
	}
	if log := logText(); !strings.Contains(log, `"msg":"stack stopped"`) || strings.Contains(log, "panic") || strings.Contains(log, "fatal error") {
		t.Errorf("stack log after SIGTERM: want a clean \"stack stopped\", got:\n%s", log)
	}
	// The stack can no longer remove its control socket; DEL does.
	if err := env.Del(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

// noCgoBinDir builds cni-usernet and cni-usernet-stack as the Makefile
// does (CGO_ENABLED=0) next to copies of the reference plugins from dir.
func noCgoBinDir(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", out+"/", "./cmd/cni-usernet", "./cmd/cni-usernet-stack")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building cni-usernet with CGO_ENABLED=0: %v\n%s", err, b)
	}
	for _, p := range []string{"host-local", "ptp"} {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, p), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func getControl(t *testing.T, sock, path string) []byte {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://stack" + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v: %.200q", path, resp.Status, err, b)
	}
	return b
}

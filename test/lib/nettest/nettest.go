// Package nettest builds cni-usernet and the reference plugins and creates
// the throwaway namespaces the root tests attach pods in. Every address a
// test uses lives in namespaces made here; everything is removed in
// t.Cleanup, also when the test fails.
package nettest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

// RequireRoot skips tests that need namespaces when not root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veths, TUN)")
	}
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// moduleRoot finds the repository root from this file's location.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return ModuleRoot(filepath.Dir(file))
}

// ModuleRoot is the directory of the go.mod that holds dir: the
// repository's root for every package of the module, wherever it sits.
func ModuleRoot(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// BinDir builds cni-usernet, cni-usernet-stack (the plugin starts stacks
// from it), cni-usernet-agent, host-local and ptp once per test binary and returns the
// directory holding them (the CNI_PATH of the tests).
func BinDir(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = newBinDir(os.TempDir())
		if buildErr != nil {
			return
		}
		args := []string{"build", "-o", binDir + "/"}
		if raceEnabled {
			args = append(args, "-race")
			if buildErr = exitRaceBuildsAtOnce(); buildErr != nil {
				return
			}
		}
		args = append(args, "./cmd/cni-usernet", "./cmd/cni-usernet-stack", "./cmd/cni-usernet-agent",
			"github.com/containernetworking/plugins/plugins/ipam/host-local",
			"github.com/containernetworking/plugins/plugins/main/ptp")
		cmd := exec.Command("go", args...)
		cmd.Dir = moduleRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// exitRaceBuildsAtOnce sets atexit_sleep_ms=0 in GORACE, which every
// plugin, IPAM and stack process the tests start inherits, unless the
// caller chose a value: the race runtime otherwise sleeps a second before
// each of them exits, half of a race run's time. A race still halts the
// process where it happens.
func exitRaceBuildsAtOnce() error {
	gorace := os.Getenv("GORACE")
	if strings.Contains(gorace, "atexit_sleep_ms=") {
		return nil
	}
	if err := os.Setenv("GORACE", strings.TrimSpace(gorace+" atexit_sleep_ms=0")); err != nil {
		return fmt.Errorf("setting GORACE for the race-built binaries: %w", err)
	}
	return nil
}

// NewNS creates a network namespace with loopback up, removed at cleanup.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	err = n.Do(func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("bringing lo up: %v", err)
	}
	return n
}

// Env is a node namespace with a network configuration to attach pods to.
type Env struct {
	T       testing.TB
	Node    ns.NetNS
	Dir     string // temporary root for state, logs, sockets, leases
	BinDir  string
	Subnet  string // IPv4 pod subnet
	Subnet6 string // IPv6 pod subnet, "" for IPv4 only
	// PodArgs are appended to the CNI_ARGS every call passes (e.g.
	// ";K8S_POD_UID=...").
	PodArgs string
	mu      sync.Mutex
	counter int
}

// NewEnv makes a node namespace and a temporary directory.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	RequireRoot(t)
	e := &Env{T: t, Node: NewNS(t), BinDir: BinDir(t), Subnet: "10.199.0.0/24", Subnet6: "fd99::/64"}
	var err error
	// Short: control socket paths must fit in 108 bytes.
	e.Dir, err = os.MkdirTemp("", "un-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs()
		}
		unmountAll(e.NetnsDir())
		os.RemoveAll(e.Dir)
		// The programs the env's first ADD loaded and attached.
		if err := sockmap.Unload(e.BPFDir()); err != nil {
			t.Errorf("unloading the socket redirect: %v", err)
		}
		os.Remove(filepath.Dir(e.BPFDir())) // the last env's takes the parent

	})
	return e
}

// BPFDir is the env's "bpfDir": the socket redirect's programs loaded by
// its ADDs, apart from the node's and every other env's.
func (e *Env) BPFDir() string {
	return filepath.Join("/sys/fs/bpf", "cni-usernet-test", filepath.Base(e.Dir))
}

// NetnsDir is the env's "netnsDir", where the stacks' own namespaces are
// pinned.
func (e *Env) NetnsDir() string { return filepath.Join(e.Dir, "run", "netns") }

// unmountAll detaches every mount stacked on dir: the plugin makes the
// directory of the wire namespaces' pins a mount point of its own.
func unmountAll(dir string) {
	for range 10 {
		if unix.Unmount(dir, unix.MNT_DETACH) != nil {
			return
		}
	}
}

// Conf returns a cni-usernet configuration for this env. extra keys are
// merged over the defaults (nil values delete a key).
func (e *Env) Conf(version string, extra map[string]any) []byte {
	ranges := []any{[]any{map[string]any{"subnet": e.Subnet}}}
	routes := []any{map[string]any{"dst": "0.0.0.0/0"}}
	if e.Subnet6 != "" {
		ranges = append(ranges, []any{map[string]any{"subnet": e.Subnet6}})
		routes = append(routes, map[string]any{"dst": "::/0"})
	}
	c := map[string]any{
		"cniVersion": version,
		"name":       "usernet-test",
		"type":       "cni-usernet",
		"mtu":        1500,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  ranges,
			"routes":  routes,
			"dataDir": filepath.Join(e.Dir, "ipam"),
		},
		"stateDir": filepath.Join(e.Dir, "state"),
		"logDir":   filepath.Join(e.Dir, "log"),
		"runDir":   filepath.Join(e.Dir, "run"),
		"netnsDir": e.NetnsDir(),
		"bpfDir":   e.BPFDir(),
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		e.T.Fatal(err)
	}
	return b
}

// Exec runs a plugin binary from BinDir in the node namespace, as a
// runtime would.
func (e *Env) Exec(plugin, command string, conf []byte, containerID string, netns ns.NetNS, ifName string) ([]byte, error) {
	path := ""
	if netns != nil {
		path = netns.Path()
	}
	return e.ExecNetns(plugin, command, conf, containerID, path, ifName)
}

// ExecNetns is Exec with CNI_NETNS given as a path, which may be empty or
// name a namespace that no longer exists (DEL must cope with both).
func (e *Env) ExecNetns(plugin, command string, conf []byte, containerID, netnsPath, ifName string) ([]byte, error) {
	args := &invoke.Args{
		Command:       command,
		ContainerID:   containerID,
		NetNS:         netnsPath,
		IfName:        ifName,
		Path:          e.BinDir,
		PluginArgsStr: "IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=" + containerID + e.PodArgs,
	}
	var out []byte
	err := e.Node.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var err error
		out, err = (&invoke.RawExec{Stderr: os.Stderr}).ExecPlugin(ctx, filepath.Join(e.BinDir, plugin), conf, args.AsEnv())
		return err
	})
	return out, err
}

// Add runs ADD and returns the result converted to the current version.
func (e *Env) Add(conf []byte, containerID string, netns ns.NetNS) (*current.Result, error) {
	out, err := e.Exec("cni-usernet", "ADD", conf, containerID, netns, "eth0")
	if err != nil {
		return nil, err
	}
	return ParseResult(conf, out)
}

// ParseResult decodes a plugin's stdout in the configuration's version.
func ParseResult(conf, out []byte) (*current.Result, error) {
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(conf, &v); err != nil {
		return nil, err
	}
	r, err := createResult(v.CNIVersion, out)
	if err != nil {
		return nil, fmt.Errorf("parsing result %s: %w", out, err)
	}
	return current.NewResultFromResult(r)
}

func createResult(version string, out []byte) (types.Result, error) {
	return resultFactory(version, out)
}

// Del runs DEL.
func (e *Env) Del(conf []byte, containerID string, netns ns.NetNS) error {
	_, err := e.Exec("cni-usernet", "DEL", conf, containerID, netns, "eth0")
	return err
}

// Check runs CHECK; conf should carry the ADD result as prevResult
// (WithPrevResult).
func (e *Env) Check(conf []byte, containerID string, netns ns.NetNS) error {
	_, err := e.Exec("cni-usernet", "CHECK", conf, containerID, netns, "eth0")
	return err
}

// HostLocal returns a host-local IPAM section whose leases live in this
// env (so Leaks sees them), with a default route per family present. Each
// range is one range set, e.g. {"subnet": "10.199.0.0/24"}.
func (e *Env) HostLocal(ranges ...map[string]any) map[string]any {
	var sets, routes []any
	v4, v6 := false, false
	for _, r := range ranges {
		sets = append(sets, []any{r})
		if s, _ := r["subnet"].(string); strings.Contains(s, ":") {
			v6 = true
		} else {
			v4 = true
		}
	}
	if v4 {
		routes = append(routes, map[string]any{"dst": "0.0.0.0/0"})
	}
	if v6 {
		routes = append(routes, map[string]any{"dst": "::/0"})
	}
	return map[string]any{
		"type":    "host-local",
		"ranges":  sets,
		"routes":  routes,
		"dataDir": filepath.Join(e.Dir, "ipam"),
	}
}

// WithPrevResult adds a prevResult to conf (for CHECK and chaining).
func WithPrevResult(t testing.TB, conf []byte, r *current.Result) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(conf, &m); err != nil {
		t.Fatal(err)
	}
	conv, err := r.GetAsVersion(m["cniVersion"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	if err := conv.PrintTo(&raw); err != nil {
		t.Fatal(err)
	}
	var prev map[string]any
	if err := json.Unmarshal(raw.Bytes(), &prev); err != nil {
		t.Fatal(err)
	}
	m["prevResult"] = prev
	b, _ := json.Marshal(m)
	return b
}

// dumpLogs prints the tail of every stack log, so a failure shows what the
// stack said.
func (e *Env) dumpLogs() {
	logs, _ := filepath.Glob(filepath.Join(e.Dir, "log", "*.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		e.T.Logf("%s:\n%s", filepath.Base(f), b)
	}
}

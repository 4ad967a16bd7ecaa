package nettest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
)

// Pod is a namespace attached through a plugin.
type Pod struct {
	ID     string
	NS     ns.NetNS
	Conf   []byte
	Result *current.Result
}

// IP returns the pod's first address of the family (4 or 6).
func (p *Pod) IP(family int) netip.Addr {
	for _, ipc := range p.Result.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		a = a.Unmap()
		if (family == 4) == a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// HostVeth returns the name of the pod's veth on the node's side (the
// result's interface outside any sandbox), "" if the result has none.
func (p *Pod) HostVeth() string {
	for _, i := range p.Result.Interfaces {
		if i.Sandbox == "" {
			return i.Name
		}
	}
	return ""
}

// Gateway returns the node-side address of the family, the address the
// pod reaches the node at.
func (p *Pod) Gateway(family int) netip.Addr {
	for _, ipc := range p.Result.IPs {
		a, _ := netip.AddrFromSlice(ipc.Gateway)
		a = a.Unmap()
		if a.IsValid() && (family == 4) == a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// NewPod creates a namespace and attaches it with conf; DEL runs at
// cleanup (a test may DEL earlier: DEL is idempotent).
func (e *Env) NewPod(conf []byte) *Pod {
	e.T.Helper()
	return e.NewPodWith("cni-usernet", conf)
}

// NewPodWith is NewPod through another plugin of BinDir, e.g. "ptp" for
// a pod on the plain kernel veth to compare with (conf's "type" must name
// the same plugin).
func (e *Env) NewPodWith(plugin string, conf []byte) *Pod {
	e.T.Helper()
	e.mu.Lock()
	e.counter++
	id := fmt.Sprintf("pod%d-%d", e.counter, time.Now().UnixNano()%100000)
	e.mu.Unlock()
	p := &Pod{ID: id, NS: NewNS(e.T), Conf: conf}
	out, err := e.Exec(plugin, "ADD", conf, id, p.NS, "eth0")
	if err != nil {
		e.T.Fatalf("%s ADD %s: %v", plugin, id, err)
	}
	if p.Result, err = ParseResult(conf, out); err != nil {
		e.T.Fatalf("%s ADD %s: %v", plugin, id, err)
	}
	e.T.Cleanup(func() {
		if _, err := e.Exec(plugin, "DEL", conf, id, p.NS, "eth0"); err != nil {
			e.T.Errorf("cleanup %s DEL %s: %v", plugin, id, err)
		}
	})
	// Runs before the DEL above (cleanups run last-in first-out), while
	// the stack's log still exists.
	e.T.Cleanup(func() {
		if e.T.Failed() {
			e.dumpLogs()
		}
	})
	return p
}

// WireNS opens the stack's own namespace of a pod attached through
// cni-usernet, the one that holds the pod's link to the node (closed at
// cleanup).
func (e *Env) WireNS(p *Pod) ns.NetNS {
	e.T.Helper()
	n, err := ns.GetNS(wirens.Path(e.NetnsDir(), stateKey(p.ID, "eth0")))
	if err != nil {
		e.T.Fatalf("opening the wire namespace of %s: %v", p.ID, err)
	}
	e.T.Cleanup(func() { n.Close() })
	return n
}

// stateKey is state.Key: importing pkg/api/state here would make an import
// cycle of pkg/api/offload's tests, which use this package.
func stateKey(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return hex.EncodeToString(sum[:8])
}

// In runs f in netns (on a locked thread).
func In(netns ns.NetNS, f func() error) error {
	return netns.Do(func(ns.NetNS) error { return f() })
}

// Listen opens a listener in netns; it stays in that namespace.
func Listen(t testing.TB, netns ns.NetNS, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := In(netns, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenUDP opens a UDP socket in netns.
func ListenUDP(t testing.TB, netns ns.NetNS, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := In(netns, func() error {
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP("udp", ua)
		return err
	})
	if err != nil {
		t.Fatalf("listening on udp %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Dial connects from netns.
func Dial(netns ns.NetNS, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := In(netns, func() (err error) {
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

// HostPort joins an address and port for Dial and Listen.
func HostPort(a netip.Addr, port int) string {
	return net.JoinHostPort(a.String(), fmt.Sprint(port))
}

// Leaks lists what attachments left behind on the node: links other than
// lo in the node namespace, attachment state, stack directories, control
// sockets, IP leases and stack processes of this env.
func (e *Env) Leaks() []string {
	var leaks []string
	_ = In(e.Node, func() error {
		links, err := netlinksafe.LinkList()
		if err != nil {
			leaks = append(leaks, "listing links: "+err.Error())
			return nil
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				leaks = append(leaks, "link "+l.Attrs().Name)
			}
		}
		return nil
	})
	for _, pattern := range []string{"state/*.json", "state/stacks/*", "run/*", "run/netns/*"} {
		m, _ := filepath.Glob(filepath.Join(e.Dir, pattern))
		for _, f := range m {
			if f == e.NetnsDir() || filepath.Base(f) == "sockmap.lock" {
				continue // the pins' directory stays, empty; a lock file
			}
			leaks = append(leaks, "file "+strings.TrimPrefix(f, e.Dir+"/"))
		}
	}
	leases, _ := filepath.Glob(filepath.Join(e.Dir, "ipam", "*", "*"))
	for _, f := range leases {
		base := filepath.Base(f)
		if base == "lock" || strings.HasPrefix(base, "last_reserved_ip") {
			continue
		}
		leaks = append(leaks, "lease "+base)
	}
	for _, pid := range e.StackPIDs() {
		leaks = append(leaks, fmt.Sprintf("stack process %d", pid))
	}
	if node, err := sockmap.Open(e.BPFDir()); err == nil {
		cookies, err := node.Enabled()
		node.Close()
		if err != nil {
			leaks = append(leaks, "listing the socket redirect's pods: "+err.Error())
		}
		for _, c := range cookies {
			leaks = append(leaks, fmt.Sprintf("socket redirect of netns cookie %d", c))
		}
	}
	slices.Sort(leaks)
	return leaks
}

// StackPIDs lists the running (not zombie) stack processes of this env.
func (e *Env) StackPIDs() []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), e.Dir) || !strings.Contains(string(b), "stack") {
			continue
		}
		var pid int
		fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &pid)
		st, err := launch.StartTime(pid)
		if err != nil || !launch.Alive(launch.Process{PID: pid, StartTime: st}) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// AssertNoLeaks fails the test with whatever attachments left behind.
func (e *Env) AssertNoLeaks(t testing.TB) {
	t.Helper()
	var leaks []string
	// A stack process that was just signalled may need a moment to exit.
	for range 50 {
		if leaks = e.Leaks(); len(leaks) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("left behind: %v", leaks)
}

// NSLeaks lists what an attachment may leave inside a pod's namespace:
// links other than lo, and nftables tables (the stack's ingress drop).
func NSLeaks(netns ns.NetNS) []string {
	var leaks []string
	err := In(netns, func() error {
		links, err := netlinksafe.LinkList()
		if err != nil {
			return fmt.Errorf("listing links: %w", err)
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				leaks = append(leaks, "link "+l.Attrs().Name)
			}
		}
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return fmt.Errorf("opening nftables: %w", err)
		}
		defer c.CloseLasting()
		tables, err := c.ListTables()
		if err != nil {
			return fmt.Errorf("listing nftables tables: %w", err)
		}
		for _, t := range tables {
			leaks = append(leaks, "nftables table "+t.Name)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlinksafe.RuleList(fam)
			if err != nil {
				return fmt.Errorf("listing policy rules: %w", err)
			}
			for _, r := range rules {
				if r.Table == podkernel.DivertTable {
					leaks = append(leaks, fmt.Sprintf("policy rule to table %d", r.Table))
				}
			}
			routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: podkernel.DivertTable}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return fmt.Errorf("listing routes: %w", err)
			}
			for range routes {
				leaks = append(leaks, fmt.Sprintf("route in table %d", podkernel.DivertTable))
			}
		}
		return nil
	})
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	slices.Sort(leaks)
	return leaks
}

// StackCPU reads a stack process's user+system CPU time.
func StackCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

// Package capabilities runs cni-usernet the way a Kubernetes runtime runs
// the conflist the node agent writes: cni-usernet, then portmap and
// bandwidth, through libcni, with the portMappings and bandwidth
// capability arguments containerd passes for a pod's hostPorts and its
// kubernetes.io/ingress-bandwidth and egress-bandwidth annotations. The
// node is a namespace of the test's, and so is "another node", joined to
// it by a veth.
package capabilities

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// The link between the node and the other node: the node has two
// addresses on it, so that two pods can take the same hostPort on
// different hostIPs.
const (
	nodeIP      = "10.198.0.1"
	nodeIP2     = "10.198.1.1"
	otherIP     = "10.198.0.2"
	otherIP2    = "10.198.1.2"
	nodeIP6     = "fd98::1"
	otherIP6    = "fd98::2"
	linkNode    = "n-other"
	linkOther   = "o-node"
	networkName = "usernet-test"
)

var (
	metaOnce sync.Once
	metaDir  string
	metaErr  error
)

// metaBinDir builds portmap and bandwidth at go.mod's version, the ones
// the image carries.
func metaBinDir(t *testing.T) string {
	t.Helper()
	metaOnce.Do(func() {
		if metaDir, metaErr = os.MkdirTemp("", "cni-usernet-meta-"); metaErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", metaDir+"/",
			"github.com/containernetworking/plugins/plugins/meta/portmap",
			"github.com/containernetworking/plugins/plugins/meta/bandwidth")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			metaErr = fmt.Errorf("building portmap and bandwidth: %w\n%s", err, out)
		}
	})
	if metaErr != nil {
		t.Fatal(metaErr)
	}
	return metaDir
}

// lab is a node with the agent's standalone conflist and another node.
type lab struct {
	t       *testing.T
	chained bool
	env     *nettest.Env
	other   ns.NetNS
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
}

// labOptions say what the node's conflist is.
type labOptions struct {
	// Chained: ptp makes the pod's veth and address, and cni-usernet is
	// chained behind it the way the agent's chain mode edits flannel's
	// list: ptp, portmap, bandwidth, cni-usernet. Zero: the agent's
	// standalone conflist, cni-usernet (with the bandwidth capability),
	// portmap.
	Chained bool
	// GSO is cni-usernet's "gso"; "" is the plugin's default (auto).
	GSO string
	// IPv6: dual-stack pods (standalone only), and IPv6 on the link
	// between the nodes.
	IPv6 bool
}

func newLab(t *testing.T, o labOptions) *lab {
	t.Helper()
	env := nettest.NewEnv(t)
	if !o.IPv6 || o.Chained {
		env.Subnet6 = ""
	}
	l := &lab{t: t, env: env, other: nettest.NewNS(t), chained: o.Chained}
	l.link()

	extra := map[string]any{}
	if o.GSO != "" {
		extra["gso"] = o.GSO
	}
	if o.Chained {
		extra["ipam"] = nil
	}
	var plugin map[string]any
	if err := json.Unmarshal(env.Conf("1.0.0", extra), &plugin); err != nil {
		t.Fatal(err)
	}
	delete(plugin, "cniVersion")
	delete(plugin, "name")
	// As pkg/agent writes them (pluginConf, standaloneConflist,
	// metaPlugins) and pkg/node/install chains them: standalone, cni-usernet
	// shapes the pod itself; chained, the bandwidth plugin goes before it.
	portmap := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true}
	bandwidth := map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}}
	plugins := []any{plugin, portmap}
	if o.Chained {
		ptp := map[string]any{"type": "ptp", "ipam": env.HostLocal(map[string]any{"subnet": env.Subnet})}
		plugins = []any{ptp, portmap, bandwidth, plugin}
	} else {
		plugin["capabilities"] = map[string]bool{"io.kubernetes.cri.pod-annotations": true, "bandwidth": true}
	}
	conflist, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"name":       networkName,
		"plugins":    plugins,
	})
	var err error
	if l.list, err = libcni.ConfListFromBytes(conflist); err != nil {
		t.Fatal(err)
	}
	l.cni = libcni.NewCNIConfigWithCacheDir([]string{env.BinDir, metaBinDir(t)}, filepath.Join(env.Dir, "cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}})
	return l
}

// link joins the node and the other node; the other node reaches the
// pods through the node.
func (l *lab) link() {
	l.t.Helper()
	err := nettest.In(l.env.Node, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: linkNode}, PeerName: linkOther, PeerNamespace: netlink.NsFd(int(l.other.Fd()))})
	})
	if err != nil {
		l.t.Fatalf("creating the link between the nodes: %v", err)
	}
	for _, side := range []struct {
		netns ns.NetNS
		link  string
		addrs []string
		route bool
	}{
		{l.env.Node, linkNode, []string{nodeIP + "/24", nodeIP2 + "/24", nodeIP6 + "/64"}, false},
		{l.other, linkOther, []string{otherIP + "/24", otherIP2 + "/24", otherIP6 + "/64"}, true},
	} {
		err := nettest.In(side.netns, func() error {
			link, err := netlink.LinkByName(side.link)
			if err != nil {
				return err
			}
			for _, a := range side.addrs {
				addr, _ := netlink.ParseAddr(a)
				addr.Flags = unix.IFA_F_NODAD // ours alone: no DAD wait
				if err := netlink.AddrAdd(link, addr); err != nil {
					return fmt.Errorf("adding %s: %w", a, err)
				}
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
			if !side.route {
				return nil
			}
			_, pods, _ := net.ParseCIDR(l.env.Subnet)
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: pods, Gw: net.ParseIP(nodeIP)}); err != nil {
				return err
			}
			if l.env.Subnet6 == "" {
				return nil
			}
			_, pods6, _ := net.ParseCIDR(l.env.Subnet6)
			return netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: pods6, Gw: net.ParseIP(nodeIP6)})
		})
		if err != nil {
			l.t.Fatalf("configuring %s: %v", side.link, err)
		}
	}
}

// pod is a sandbox attached through the whole list.
type pod struct {
	id    string
	netns ns.NetNS
	rt    *libcni.RuntimeConf
	ip    string
	host  string // the host side of its veth
}

// add attaches a new pod with the capability arguments a runtime passes
// (portMappings, bandwidth); DEL runs at cleanup.
func (l *lab) add(name string, caps map[string]any) *pod {
	l.t.Helper()
	p := &pod{id: fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%1000000), netns: nettest.NewNS(l.t)}
	p.rt = &libcni.RuntimeConf{
		ContainerID: p.id,
		NetNS:       p.netns.Path(),
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "test"}, {"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.id},
		},
		CapabilityArgs: caps,
	}
	var out []byte
	err := nettest.In(l.env.Node, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		r, err := l.cni.AddNetworkList(ctx, l.list, p.rt)
		if err != nil {
			return err
		}
		out, err = json.Marshal(r)
		return err
	})
	if err != nil {
		l.t.Fatalf("ADD %s: %v", name, err)
	}
	l.t.Cleanup(func() {
		if err := l.del(p); err != nil {
			l.t.Errorf("cleanup: DEL %s: %v", name, err)
		}
	})
	res, err := nettest.ParseResult([]byte(`{"cniVersion":"1.0.0"}`), out)
	if err != nil {
		l.t.Fatal(err)
	}
	for _, ipc := range res.IPs {
		if ipc.Address.IP.To4() != nil {
			p.ip = ipc.Address.IP.String()
		}
	}
	for _, i := range res.Interfaces {
		if i.Sandbox == "" && !strings.HasPrefix(i.Name, "bwp") {
			p.host = i.Name
		}
	}
	if p.ip == "" || p.host == "" {
		l.t.Fatalf("ADD %s: result %s has no IPv4 address or no host interface", name, out)
	}
	return p
}

func (l *lab) del(p *pod) error {
	return nettest.In(l.env.Node, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		return l.cni.DelNetworkList(ctx, l.list, p.rt)
	})
}

// check runs CHECK over the list. Chained behind ptp it is not run: ptp's
// CHECK looks for the pod's address on eth0 in the pod's kernel, which
// cni-usernet's stack holds instead (bridge's, under flannel, does the
// same); the runtimes Kubernetes uses do not call CHECK.
func (l *lab) check(p *pod) error {
	if l.chained {
		return nil
	}
	return nettest.In(l.env.Node, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		return l.cni.CheckNetworkList(ctx, l.list, p.rt)
	})
}

// nsExec runs a command in netns and returns its combined output.
func nsExec(ctx context.Context, netns ns.NetNS, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netns.Path()}, args...)...).CombinedOutput()
	return string(out), err
}

// containerd's burst for a bandwidth annotation (no burst annotation
// exists): math.MaxUint32 bits, as its CRI plugin passes it.
const runtimeBurst = math.MaxUint32

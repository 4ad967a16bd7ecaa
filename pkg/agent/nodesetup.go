package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/install"
)

// nodeSetup is the agent's node-install step (--install): it puts the
// plugin's binaries and CNI configuration on the node through
// pkg/node/install, keeps them and the plugin's kubeconfig in place, and
// when the DaemonSet is deleted takes them away again (nodeteardown.go).
type nodeSetup struct {
	f    *agentFlags
	opts install.Options
	api  *apiClient // nil outside a cluster
	log  *slog.Logger
	// routes, when set, are this node's routes to other nodes' pods:
	// removed with the rest on uninstall.
	routes *nodeRoutes
	// mtu is the pods' MTU the conflist carries and how it was chosen
	// (standalone; zero chained).
	mtu noderoutes.MTUChoice
}

// newNodeSetup installs the binary and renders the configuration; the
// configuration itself is written by writeConfig, once the agent is ready.
func newNodeSetup(ctx context.Context, f *agentFlags, log *slog.Logger) (*nodeSetup, error) {
	n := &nodeSetup{f: f, log: log}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		c, err := inCluster()
		if err != nil {
			return nil, err
		}
		n.api = c
	}
	if f.kubeconfigOut != "" {
		if n.api == nil {
			return nil, fmt.Errorf("--kubeconfig-out needs the agent to run in a cluster (no service account)")
		}
		if err := n.writeKubeconfig(); err != nil {
			return nil, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding own executable: %w", err)
	}
	// The image carries the plugin's binary and the stack's beside the
	// agent's.
	plugin, err := pluginBinary(filepath.Dir(self))
	if err != nil {
		return nil, err
	}
	stackSource, err := attachment.StackBinary(plugin)
	if err != nil {
		return nil, err
	}
	n.opts = install.Options{
		Source:      plugin,
		StackSource: stackSource,
		BinDir:      f.cniBinDir,
		ConfDir:     f.cniConfDir,
		Name:        "cni-usernet",
		Mode:        install.Mode(f.mode),
		RecordPath:  filepath.Join(f.stateDir, install.RecordName),
		Log:         log,
	}
	if n.opts.Helpers, err = helperBinaries(filepath.Dir(self), f); err != nil {
		return nil, err
	}
	conf, err := n.pluginConf(ctx)
	if err != nil {
		return nil, err
	}
	if f.mode == "chain" {
		n.opts.Plugin = conf
		n.opts.After = metaPlugins(f)
	} else {
		n.opts.Conflist = standaloneConflist(conf, metaPlugins(f))
	}
	changed, err := install.InstallBinary(n.opts)
	if err != nil {
		return nil, err
	}
	log.Info("plugin binaries installed", "dir", f.cniBinDir, "stack", n.opts.StackSource != "", "changed", changed)
	return n, nil
}

// hostPath is where a path the agent sees lies on the node.
func (n *nodeSetup) hostPath(p string) string {
	if n.f.hostPrefix != "" && strings.HasPrefix(p, n.f.hostPrefix+"/") {
		return strings.TrimPrefix(p, n.f.hostPrefix)
	}
	return p
}

// pluginConf is the cni-usernet plugin object, standalone or chained.
func (n *nodeSetup) pluginConf(ctx context.Context) ([]byte, error) {
	// cgroupPath: runtimes that pass it (containerd ≥ 1.7.1, CRI-O) name
	// the pod's cgroup, which its stack is charged to (docs/accounting.md).
	caps := map[string]bool{netconf.PodAnnotationsCapability: true, "cgroupPath": true}
	if n.f.bandwidth && n.f.mode == "standalone" {
		// Standalone, cni-usernet shapes its pods itself (pkg/node/shaping):
		// the bandwidth plugin looks for the pod's veth where the pod's
		// interface is the stack's TUN.
		caps["bandwidth"] = true
	}
	p := map[string]any{
		"type":         "cni-usernet",
		"gso":          n.f.gso,
		"capabilities": caps,
	}
	if n.f.kubeconfigOut != "" {
		p["kubeconfig"] = n.hostPath(n.f.kubeconfigOut)
	}
	if n.f.nodeName != "" {
		p["nodeName"] = n.f.nodeName
	}
	if n.f.stateDir != netconf.DefaultStateDir {
		p["stateDir"] = n.f.stateDir
	}
	if n.f.networkPolicy {
		// ADD then waits until the pod's stack holds its policy.
		p["networkPolicy"] = true
	}
	n.f.setStackDefaults(p)
	if n.f.mode == "standalone" {
		subnets, err := n.podSubnets(ctx)
		if err != nil {
			return nil, err
		}
		var ranges []any
		var routes []any
		for _, s := range subnets {
			ranges = append(ranges, []any{map[string]string{"subnet": s}})
			if strings.Contains(s, ":") {
				routes = append(routes, map[string]string{"dst": "::/0"})
			} else {
				routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
			}
		}
		if n.mtu, err = n.podMTU(ctx, subnets); err != nil {
			return nil, err
		}
		p["mtu"] = n.mtu.MTU
		p["ipam"] = map[string]any{"type": "host-local", "ranges": ranges, "routes": routes}
	}
	return json.Marshal(p)
}

// podMTU chooses the pods' MTU (standalone) from --mtu, or from the
// node's links, its InternalIPs and the pods' subnets, and logs it.
func (n *nodeSetup) podMTU(ctx context.Context, subnets []string) (noderoutes.MTUChoice, error) {
	enc, err := noderoutes.ParseEncapsulation(n.f.encapsulation)
	if err != nil {
		return noderoutes.MTUChoice{}, fmt.Errorf("--encapsulation: %w", err)
	}
	o := noderoutes.MTUOptions{MTU: n.f.mtu, Encapsulation: enc}
	for _, s := range subnets {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			o.PodCIDRs = append(o.PodCIDRs, p)
		}
	}
	if o.MTU == 0 && n.api != nil && n.f.nodeName != "" {
		if o.InternalIPs, err = n.api.nodeInternalIPs(ctx, n.f.nodeName); err != nil {
			return noderoutes.MTUChoice{}, fmt.Errorf("choosing the pods' MTU: %w", err)
		}
	}
	c, err := noderoutes.PodMTU(o)
	if err != nil {
		return noderoutes.MTUChoice{}, fmt.Errorf("choosing the pods' MTU: %w", err)
	}
	if n.log != nil {
		n.log.Info("pods' MTU", "mtu", c.MTU, "source", c.Source)
	}
	return c, nil
}

// standaloneConflist is the conflist of standalone mode: our plugin,
// then the meta plugins, which get our result (the pod's addresses, the
// host side of its veth) as prevResult.
func standaloneConflist(plugin []byte, meta [][]byte) []byte {
	plugins := []json.RawMessage{plugin}
	for _, m := range meta {
		plugins = append(plugins, m)
	}
	b, _ := json.MarshalIndent(map[string]any{
		// 1.0.0: the newest version containerd 1.6's libcni accepts.
		"cniVersion": "1.0.0",
		"name":       "cni-usernet",
		"plugins":    plugins,
	}, "", "  ")
	return b
}

// The meta plugins --port-map and --bandwidth chain beside ours, in the
// form the Kubernetes runtimes pass the pod's hostPorts and bandwidth
// annotations to (the capabilities), as flannel's and Calico's lists
// carry them. The bandwidth plugin only in chain mode, before ours
// (pkg/node/install); standalone, our plugin takes the capability.
var (
	portmapPlugin   = []byte(`{"type":"portmap","capabilities":{"portMappings":true},"snat":true}`)
	bandwidthPlugin = []byte(`{"type":"bandwidth","capabilities":{"bandwidth":true}}`)
)

func metaPlugins(f *agentFlags) [][]byte {
	var m [][]byte
	if f.portMap {
		m = append(m, portmapPlugin)
	}
	if f.bandwidth && f.mode == "chain" {
		m = append(m, bandwidthPlugin)
	}
	return m
}

// helperBinaries are the meta plugins' binaries the image carries in
// dir, beside the agent's own. One the image lacks must already be on the
// node: a conflist naming a missing plugin fails every pod's ADD.
func helperBinaries(dir string, f *agentFlags) ([]install.Helper, error) {
	var helpers []install.Helper
	for _, h := range []struct {
		name, flag string
		on         bool
	}{{"portmap", "--port-map", f.portMap}, {"bandwidth", "--bandwidth", f.bandwidth && f.mode == "chain"}} {
		if !h.on {
			continue
		}
		src := filepath.Join(dir, h.name)
		if fi, err := os.Stat(src); err == nil && fi.Mode().IsRegular() {
			helpers = append(helpers, install.Helper{Name: h.name, Source: src})
			continue
		}
		if _, err := os.Stat(filepath.Join(f.cniBinDir, h.name)); err != nil {
			return nil, fmt.Errorf("%s: no %s binary beside the agent (%s) nor on the node (%s): use an image that carries it, install it on the node, or pass %s=false",
				h.flag, h.name, src, f.cniBinDir, h.flag)
		}
	}
	return helpers, nil
}

// podSubnets are --subnet, or the node's pod CIDRs from the API server.
func (n *nodeSetup) podSubnets(ctx context.Context) ([]string, error) {
	if n.f.subnets != "" {
		return strings.Split(n.f.subnets, ","), nil
	}
	if n.api == nil || n.f.nodeName == "" {
		return nil, fmt.Errorf("no pod subnet: pass --subnet, or run in a cluster with --node-name")
	}
	// The controller manager may not have allocated the node's CIDR yet.
	for {
		cidrs, err := n.api.nodePodCIDRs(ctx, n.f.nodeName)
		if err == nil && len(cidrs) > 0 {
			return cidrs, nil
		}
		n.log.Warn("waiting for the node's pod CIDR", "node", n.f.nodeName, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("reading pod CIDRs of node %s: %w", n.f.nodeName, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}

func (n *nodeSetup) writeKubeconfig() error {
	// The plugin acts with the agent's own (rotating) token: kubelet
	// refreshes the file at 80 % of its lifetime and keep() copies it on.
	token, err := os.ReadFile(n.api.rest.BearerTokenFile)
	if err != nil {
		return fmt.Errorf("reading the service account token: %w", err)
	}
	server := n.api.rest.Host
	if n.f.apiServer != "" {
		server = n.f.apiServer
	}
	changed, err := kube.WriteKubeconfig(n.f.kubeconfigOut, server, n.api.caPEM, strings.TrimSpace(string(token)))
	if err != nil {
		return fmt.Errorf("writing the plugin's kubeconfig: %w", err)
	}
	if changed {
		n.log.Info("plugin kubeconfig written", "path", n.f.kubeconfigOut)
	}
	return nil
}

// writeConfig writes the CNI configuration, retrying in chain mode until
// the node's own network plugin has written its configuration.
func (n *nodeSetup) writeConfig(ctx context.Context) error {
	for {
		path, changed, err := install.InstallConfig(n.opts)
		if err == nil {
			n.log.Info("CNI configuration installed", "path", path, "changed", changed)
			return nil
		}
		if !errors.Is(err, install.ErrNothingToChain) {
			return fmt.Errorf("installing the CNI configuration: %w", err)
		}
		n.log.Warn("cannot chain yet", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// keep re-applies the configuration (another installer may rewrite the
// conflist we chained into) and keeps the plugin's token fresh.
func (n *nodeSetup) keep(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if path, changed, err := install.InstallConfig(n.opts); err != nil {
			n.log.Error("re-installing the CNI configuration", "err", err)
		} else if changed {
			n.log.Info("CNI configuration restored", "path", path)
		}
		if n.f.kubeconfigOut != "" {
			if err := n.writeKubeconfig(); err != nil {
				n.log.Error("refreshing the plugin's kubeconfig", "err", err)
			}
		}
	}
}

// pluginBinary is the plugin's binary the image carries in dir, beside
// the agent's: the one the agent installs on the node.
func pluginBinary(dir string) (string, error) {
	p := filepath.Join(dir, "cni-usernet")
	fi, err := os.Stat(p)
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err != nil {
		return "", fmt.Errorf("finding the plugin's binary beside the agent's (install cni-usernet with cni-usernet-agent): %w", err)
	}
	return p, nil
}

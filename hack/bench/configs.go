package main

import (
	"encoding/json"
	"fmt"
)

// Network addresses used by every configuration. They exist only inside the
// namespaces the benchmark creates.
const (
	subnet4 = "10.199.0.0/24"
	subnet6 = "fd99::/64"
	mtu     = 1500
	netName = "bench" // one network name, so host-local hands out distinct IPs to all pods
)

// config is one way of attaching a pod.
type config struct {
	Name   string
	Desc   string
	Plugin string // "ptp" or "cni-usernet"
	GSO    string // cni-usernet "gso" key; empty for ptp
	// NoOffload turns tso/gso/sg off on both veth ends. cni-usernet is also
	// given podLinkOffloadsOff, so that its GSO detection, which runs
	// during ADD, sees the link that way.
	NoOffload bool
	// GSOMaxSegs, when non-zero, is set on both veth ends after ADD.
	// cni-usernet is also given gsoMaxSegs, the cap its detection would
	// have read from such a link.
	GSOMaxSegs int
}

func (c *config) usernet() bool { return c.Plugin == "cni-usernet" }

// baseline is the configuration every ratio is taken against.
const baseline = "kernel"

var allConfigs = []*config{
	{Name: "kernel", Plugin: "ptp", Desc: "kernel veth (ptp), offloads on"},
	{Name: "kernel-nooffload", Plugin: "ptp", NoOffload: true, Desc: "kernel veth, tso/gso/sg off on both ends"},
	{Name: "kernel-segs2", Plugin: "ptp", GSOMaxSegs: 2, Desc: "kernel veth, gso_max_segs 2 on both ends"},
	{Name: "usernet-hardware", Plugin: "cni-usernet", GSO: "hardware", Desc: `cni-usernet "gso": "hardware"`},
	{Name: "usernet-software", Plugin: "cni-usernet", GSO: "software", Desc: `cni-usernet "gso": "software"`},
	{Name: "usernet-off", Plugin: "cni-usernet", GSO: "off", Desc: `cni-usernet "gso": "off"`},
	{Name: "usernet-auto-nooffload", Plugin: "cni-usernet", GSO: "auto", NoOffload: true, Desc: `cni-usernet "gso": "auto", tso/gso/sg off on the link`},
	{Name: "usernet-segs2", Plugin: "cni-usernet", GSO: "hardware", GSOMaxSegs: 2, Desc: `cni-usernet "gso": "hardware", gso_max_segs 2 on the link`},
}

// addConfigs are the plugins whose ADD latency is measured, with the
// attachment configuration used for it.
var addConfigs = []struct{ Name, Of string }{
	{"add-ptp", "kernel"},
	{"add-cni-usernet", "usernet-hardware"},
}

func configByName(name string) *config {
	for _, c := range allConfigs {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// conflist renders the CNI network configuration list for c. stateDir and
// logDir are only used by cni-usernet, ipamDir by host-local.
func (c *config) conflist(ipamDir, stateDir, logDir string, ipv6 bool) ([]byte, error) {
	ranges := [][]map[string]string{{{"subnet": subnet4}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if ipv6 {
		ranges = append(ranges, []map[string]string{{"subnet": subnet6}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	ipam := map[string]any{"type": "host-local", "dataDir": ipamDir, "ranges": ranges, "routes": routes}
	plugin := map[string]any{"type": c.Plugin, "mtu": mtu, "ipam": ipam}
	switch c.Plugin {
	case "ptp":
		plugin["ipMasq"] = false
	case "cni-usernet":
		plugin["gso"] = c.GSO
		plugin["stateDir"] = stateDir
		plugin["logDir"] = logDir
		if c.NoOffload {
			plugin["podLinkOffloadsOff"] = true
		}
		if c.GSOMaxSegs > 0 {
			plugin["gsoMaxSegs"] = c.GSOMaxSegs
		}
	default:
		return nil, fmt.Errorf("unknown plugin %q", c.Plugin)
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.1.0",
		"name":       netName,
		"plugins":    []any{plugin},
	}, "", "  ")
}

package netconf

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
)

// ParseForDelete reads what DEL needs from a configuration Parse refuses:
// a conflist that was valid when the pod was added may break a rule of a
// newer cni-usernet, and its pods must still be deletable. Every key is
// taken if it decodes and ignored if not; only JSON that is not an object
// fails.
func ParseForDelete(data []byte) (*NetConf, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parsing network configuration: %w", err)
	}
	var c NetConf
	for key, dst := range map[string]*string{
		"cniVersion": &c.CNIVersion, "name": &c.Name, "type": &c.Type,
		"stateDir": &c.StateDir, "logDir": &c.LogDir, "runDir": &c.RunDir, "netnsDir": &c.NetnsDir, "mountNS": &c.MountNS, "tunName": &c.TUNName, "bpfDir": &c.BPFDir,
	} {
		if v, ok := raw[key]; ok {
			_ = json.Unmarshal(v, dst)
		}
	}
	if v, ok := raw["ipam"]; ok {
		_ = json.Unmarshal(v, &c.IPAM)
	}
	if v, ok := raw["prevResult"]; ok {
		if json.Unmarshal(v, &c.RawPrevResult) == nil && version.ParsePrevResult(&c.PluginConf) != nil {
			c.PrevResult = nil
		}
	}
	for _, d := range []struct {
		dst *string
		def string
	}{{&c.StateDir, DefaultStateDir}, {&c.LogDir, DefaultLogDir}, {&c.RunDir, DefaultRunDir}, {&c.NetnsDir, DefaultNetnsDir}, {&c.MountNS, DefaultMountNS}, {&c.BPFDir, DefaultBPFDir}} {
		if *d.dst == "" || !filepath.IsAbs(*d.dst) {
			*d.dst = d.def
		}
	}
	if c.TUNName == "" || !ValidIfName(c.TUNName) {
		c.TUNName = stackconfig.DefaultTUNName
	}
	return &c, nil
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"encoding/json"
	"fmt"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
)

// stackDefault is one of the node's defaults for its pods' stacks: an
// agent flag and the conflist key it sets.
type stackDefault struct {
	flag, key string
	value     any // nil: not set, the key is left out
}

// stackDefaults are the flags that set the conflist's stack keys, with
// the values given. An unset flag leaves its key out of the conflist, so
// that the plugin's own default applies (and follows the plugin's
// version, not the agent's).
func (f *agentFlags) stackDefaults() []stackDefault {
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	threads := any(nil)
	if f.stackThreads != 0 {
		threads = f.stackThreads
	}
	return []stackDefault{
		{"--stack-cgroup", "stackCgroup", str(f.stackCgroup)},
		{"--busy-poll", "busyPoll", str(f.busyPoll)},
		{"--stack-threads", "stackThreads", threads},
		{"--socket-redirect", "socketRedirect", str(f.socketRedirect)},
	}
}

// validateStackDefaults checks each stack default as the plugin will when
// it reads the conflist: a value the plugin refuses would fail every
// pod's ADD on the node, so the agent refuses to start with it instead.
func (f *agentFlags) validateStackDefaults() error {
	for _, d := range f.stackDefaults() {
		if d.value == nil {
			continue
		}
		conf, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "cni-usernet", "type": "cni-usernet", d.key: d.value})
		if err != nil {
			return fmt.Errorf("%s: %w", d.flag, err)
		}
		if _, err := netconf.Parse(conf); err != nil {
			return fmt.Errorf("%s %v: %w", d.flag, d.value, err)
		}
	}
	return nil
}

// setStackDefaults writes the stack defaults the flags give into the
// plugin's conflist entry p.
func (f *agentFlags) setStackDefaults(p map[string]any) {
	for _, d := range f.stackDefaults() {
		if d.value != nil {
			p[d.key] = d.value
		}
	}
}

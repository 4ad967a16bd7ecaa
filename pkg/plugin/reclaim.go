package plugin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/pkg/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/state"
)

// Reclaim undoes an attachment from its state alone: its stack, its
// namespace leftovers, its node-side veth, its IP lease and its files. The
// node agent uses it for attachments whose network namespace is gone
// without a DEL (a runtime that lost the pod, a reboot). The caller holds
// the attachment's lock. cniPath is where the IPAM plugin is found.
func Reclaim(store state.Store, att *state.Attachment, cniPath string, log *slog.Logger) error {
	conf := &netconf.NetConf{
		StateDir: store.Dir,
		RunDir:   filepath.Dir(att.ControlSocket),
		LogDir:   filepath.Dir(att.LogPath),
		TUNName:  tunNameOf(att.ConfigPath),
	}
	conf.Name = att.Network
	inv := &invocation{conf: conf, store: store, log: log, close: func() {}}
	td := teardown{
		inv: inv, containerID: att.ContainerID, ifName: att.IfName,
		netns: att.Netns, cniPath: cniPath,
	}
	td.fromState(att)
	if err := td.run(); err != nil {
		return fmt.Errorf("reclaiming %s/%s: %w", att.ContainerID, att.IfName, err)
	}
	return nil
}

// tunNameOf reads the TUN name from the stack's config; the default when
// the config is unreadable (the namespace, and the TUN with it, is usually
// gone by then anyway).
func tunNameOf(configPath string) string {
	var c stackconfig.Config
	if b, err := os.ReadFile(configPath); err == nil && json.Unmarshal(b, &c) == nil && c.TUNName != "" {
		return c.TUNName
	}
	return stackconfig.DefaultTUNName
}

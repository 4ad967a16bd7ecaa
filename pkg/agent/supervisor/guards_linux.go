// SPDX-License-Identifier: Apache-2.0

package supervisor

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
)

// reconcileGuards puts back the source guard of every attachment that
// has one recorded and lost it: ADD installs it once, and anything on the
// node that flushes the ruleset (`nft flush ruleset`, a firewall's
// reload) takes every pod's away. Run on the reconcile timer and when
// nftables reports a deletion.
func (s *Supervisor) reconcileGuards() {
	atts, _ := s.cfg.Store.List()
	for _, att := range atts {
		if att.SourceGuard == "" {
			continue
		}
		if ok, err := sourceguard.Holds(att.SourceGuard); err != nil || ok {
			continue
		}
		s.restoreGuard(att.ContainerID, att.IfName)
	}
}

// restoreGuard installs an attachment's guard again, under its lock (an
// ADD or DEL in progress is left alone: DEL removes the guard before the
// link, and its state after).
func (s *Supervisor) restoreGuard(containerID, ifName string) {
	log := s.cfg.Log.With("containerID", containerID, "ifName", ifName)
	lock, err := s.cfg.Store.LockKey(state.Key(containerID, ifName), 0)
	if err != nil {
		return
	}
	defer lock.Release()
	att, err := s.cfg.Store.Load(containerID, ifName)
	if err != nil || att.SourceGuard == "" {
		return
	}
	if ok, err := sourceguard.Holds(att.SourceGuard); err != nil || ok {
		return
	}
	if _, err := netlinksafe.LinkByName(att.SourceGuard); err != nil {
		return // the pod's link is gone: reclaim's business, not the guard's
	}
	g, err := guardOf(att)
	if err == nil {
		err = sourceguard.Install(g)
	}
	if err != nil {
		log.Error("restoring the pod's source guard", "link", att.SourceGuard, "err", err)
		return
	}
	s.stats.SourceGuardsRestored.Add(1)
	log.Warn("restored the pod's source guard: something on the node removed it", "link", att.SourceGuard, "table", sourceguard.TableName(att.SourceGuard))
}

// guardOf is the guard ADD installed for att: its addresses from the
// state, its MAC from the pod's end of the link, in the stack's own
// namespace (or the pod's, for an attachment of the earlier layout).
func guardOf(att *state.Attachment) (sourceguard.Guard, error) {
	g := sourceguard.Guard{Link: att.SourceGuard}
	for _, c := range att.IPs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return g, fmt.Errorf("pod address %q: %w", c, err)
		}
		g.IPs = append(g.IPs, p.Addr())
	}
	where := att.WireNetns
	if where == "" {
		where = att.Netns
	}
	err := ns.WithNetNSPath(where, func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(att.IfName)
		if err != nil {
			return err
		}
		g.MAC = append(net.HardwareAddr(nil), l.Attrs().HardwareAddr...)
		return nil
	})
	if err != nil {
		return g, fmt.Errorf("reading the MAC of %s in %s: %w", att.IfName, where, err)
	}
	return g, nil
}

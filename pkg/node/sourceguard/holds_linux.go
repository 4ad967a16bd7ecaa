// SPDX-License-Identifier: Apache-2.0

package sourceguard

import (
	"context"
	"fmt"

	"github.com/google/nftables"
)

// Holds reports whether the guard Install put on link is in force, in the
// calling thread's network namespace: its table with its drop counter and
// its ingress chain hooked on link, holding rules. It is what anything
// on the node that flushes the ruleset or deletes the table takes away,
// for a caller that restores it (the node agent).
func Holds(link string) (bool, error) {
	if err := validName(link); err != nil {
		return false, fmt.Errorf("checking the source guard on %s: %w", link, err)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return false, fmt.Errorf("checking the source guard on %s: opening netlink: %w", link, err)
	}
	defer c.CloseLasting()
	t := table(link)
	if _, ok, err := readCounter(c, t); err != nil || !ok {
		return false, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return false, fmt.Errorf("checking the source guard on %s: listing chains: %w", link, err)
	}
	for _, ch := range chains {
		if ch.Table.Name != t.Name || ch.Name != chainIngress {
			continue
		}
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookIngress {
			return false, nil
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return false, fmt.Errorf("checking the source guard on %s: listing rules: %w", link, err)
		}
		return len(rules) > 0, nil
	}
	return false, nil
}

// Changes signals, until ctx ends, when a table, chain or rule is deleted
// in the calling thread's network namespace (nftables' monitor): the
// moment a guard may have gone. Signals coalesce: the channel holds one.
func Changes(ctx context.Context) (<-chan struct{}, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("watching nftables: opening netlink: %w", err)
	}
	// Every event, filtered here: the library delivers a transaction's
	// events with its generation message, which only the monitor of
	// everything asks for.
	mon := nftables.NewMonitor()
	events, err := c.AddMonitor(mon)
	if err != nil {
		return nil, fmt.Errorf("watching nftables: %w", err)
	}
	out := make(chan struct{}, 1)
	go func() {
		<-ctx.Done()
		mon.Close()
	}()
	go func() {
		defer close(out)
		for ev := range events {
			switch ev.Type {
			case nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeDelChain,
				nftables.MonitorEventTypeDelRule, nftables.MonitorEventTypeDelObj:
			default:
				continue
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out, nil
}

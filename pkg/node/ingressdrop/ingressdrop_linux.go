package ingressdrop

import (
	"fmt"

	"github.com/cni-usernet/cni-usernet/pkg/node/nfttable"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

const (
	// tablePrefix starts the name of every table this package owns.
	tablePrefix = "cni-usernet-"
	// chainName is the base chain inside each table.
	chainName = "ingress"
	// probeTable is the throwaway table Supported creates and deletes in
	// the same transaction.
	probeTable = tablePrefix + "probe"
	// probeDevice is the link Supported hooks the probe chain to: every
	// network namespace has one.
	probeDevice = "lo"
)

// TableName returns the name of the netdev table that Install creates for
// ifName, for logs and for `nft list table netdev <name>`.
func TableName(ifName string) string {
	return tablePrefix + ifName
}

// Install makes the kernel drop every frame received on ifName before any
// protocol handler sees it, in the calling thread's network namespace. It
// is idempotent: it replaces the link's table in one transaction, so after
// any number of calls exactly one table with one policy-drop chain exists.
//
// Whether the link must already exist depends on the kernel: older kernels
// refuse a hook on a missing device (ENOENT); newer ones (seen on 6.18; the
// name-based hook binding landed around 6.16) keep the hook by name and
// attach it when a link of that name appears in the namespace, so there
// Install may run before the link is moved in.
func Install(ifName string) error {
	if err := validName(ifName); err != nil {
		return fmt.Errorf("installing ingress drop: %w", err)
	}
	err := transact(func(c *nftables.Conn) error {
		t := &nftables.Table{Name: TableName(ifName), Family: nftables.TableFamilyNetdev}
		if err := nfttable.Replace(c, t); err != nil {
			return err
		}
		c.AddChain(dropChain(t, ifName, nftables.ChainPolicyDrop))
		return nil
	})
	if err != nil {
		return fmt.Errorf("installing ingress drop table %s on %s: %w", TableName(ifName), ifName, err)
	}
	return nil
}

// Remove deletes the table Install created for ifName, in the calling
// thread's network namespace, so the kernel processes the link's frames
// again. A table that is already gone, or a link that no longer exists, is
// success.
func Remove(ifName string) error {
	if err := validName(ifName); err != nil {
		return fmt.Errorf("removing ingress drop: %w", err)
	}
	err := transact(func(c *nftables.Conn) error {
		t := &nftables.Table{Name: TableName(ifName), Family: nftables.TableFamilyNetdev}
		c.AddTable(t) // makes the delete valid when the table is gone
		c.DelTable(t)
		return nil
	})
	if err != nil {
		return fmt.Errorf("removing ingress drop table %s of %s: %w", TableName(ifName), ifName, err)
	}
	return nil
}

// Installed reports whether the table Install creates for ifName exists in
// the calling thread's network namespace and holds the ingress base chain
// with policy drop.
func Installed(ifName string) (bool, error) {
	if err := validName(ifName); err != nil {
		return false, fmt.Errorf("checking ingress drop: %w", err)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return false, fmt.Errorf("checking ingress drop on %s: opening netlink: %w", ifName, err)
	}
	defer c.CloseLasting()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return false, fmt.Errorf("checking ingress drop on %s: listing netdev chains: %w", ifName, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName(ifName) || ch.Name != chainName {
			continue
		}
		return ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookIngress &&
			ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop, nil
	}
	return false, nil
}

// Supported probes, in the calling thread's network namespace, whether the
// kernel can hook an nftables netdev chain to ingress: it creates a table
// with a policy-accept ingress chain on lo and deletes it in the same
// transaction, so nothing is left behind and no frame is dropped.
func Supported() error {
	err := transact(func(c *nftables.Conn) error {
		t := &nftables.Table{Name: probeTable, Family: nftables.TableFamilyNetdev}
		c.AddTable(t)
		c.AddChain(dropChain(t, probeDevice, nftables.ChainPolicyAccept))
		c.DelTable(t)
		return nil
	})
	if err != nil {
		return fmt.Errorf("kernel lacks nftables netdev ingress support: %w", err)
	}
	return nil
}

// dropChain is the base chain hooked to ingress of device in t.
func dropChain(t *nftables.Table, device string, policy nftables.ChainPolicy) *nftables.Chain {
	return &nftables.Chain{
		Name:     chainName,
		Table:    t,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookIngress,
		Priority: nftables.ChainPriorityFilter,
		Device:   device,
		Policy:   &policy,
	}
}

// transact runs the messages batch adds as one nftables transaction on a
// netlink socket opened in the calling thread's network namespace.
func transact(batch func(*nftables.Conn) error) error {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer c.CloseLasting()
	if err := batch(c); err != nil {
		return err
	}
	return c.Flush()
}

func validName(ifName string) error {
	if ifName == "" || len(ifName) >= unix.IFNAMSIZ {
		return fmt.Errorf("invalid interface name %q: want 1 to %d bytes", ifName, unix.IFNAMSIZ-1)
	}
	return nil
}

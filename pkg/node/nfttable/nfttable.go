// Package nfttable makes an nftables table exist empty, deleting it first
// only when it is there. It is a package of its own because three
// packages each own one nftables table and replace it the same way:
// sourceguard (the node's check of a pod's sources), ingressdrop (the
// kernel kept off a pod link's frames) and podnet (the divert of the
// pod's traffic to its stack); none of them uses another.
//
// "add; delete; add" in one transaction is nft's idiom for replacing a
// table whether or not it exists. The delete has a price even when the
// table was not there before the transaction: the kernel frees what it
// deleted after an RCU grace period, in a work item, and closing the
// netlink socket waits for that work (NETLINK_URELEASE flushes it under
// the namespace's nftables mutex). That is milliseconds per table, and a
// pod's stack installs two of them as it starts, a large share of its
// start (docs/performance.md, on how long a stack takes to start). A
// pod's namespace is new, so the delete is only needed when a stack
// restarts.
package nfttable

import (
	"fmt"

	"github.com/google/nftables"
)

// Replace queues on c the messages that leave t existing and empty when c
// is flushed: an add, preceded by "add; delete" if t exists now.
func Replace(c *nftables.Conn, t *nftables.Table) error {
	tables, err := c.ListTablesOfFamily(t.Family)
	if err != nil {
		return fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, have := range tables {
		if have.Name == t.Name {
			c.AddTable(t) // the add makes the delete valid
			c.DelTable(t)
			break
		}
	}
	c.AddTable(t)
	return nil
}

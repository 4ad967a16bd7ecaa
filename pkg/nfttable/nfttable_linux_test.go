package nfttable

import (
	"runtime"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/google/nftables"
)

// inNewNS runs f in a fresh network namespace.
func inNewNS(t *testing.T, f func()) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and network namespaces")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Skipf("creating a network namespace: %v", err)
	}
	t.Cleanup(func() { n.Close(); testutils.UnmountNS(n) })
	if err := n.Do(func(ns.NetNS) error {
		runtime.LockOSThread()
		f()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func replace(t *testing.T, tbl *nftables.Table, then func(*nftables.Conn)) {
	t.Helper()
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	if err := Replace(c, tbl); err != nil {
		t.Fatal(err)
	}
	if then != nil {
		then(c)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flushing: %v", err)
	}
}

func chains(t *testing.T, tbl *nftables.Table) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(tbl.Family)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range all {
		if ch.Table.Name == tbl.Name {
			names = append(names, ch.Name)
		}
	}
	return names
}

func tableExists(t *testing.T, tbl *nftables.Table) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(tbl.Family)
	if err != nil {
		t.Fatal(err)
	}
	for _, have := range tables {
		if have.Name == tbl.Name {
			return true
		}
	}
	return false
}

// TestReplace: an absent table is created; a present one comes back
// empty, whatever it held; other tables are untouched.
func TestReplace(t *testing.T) {
	inNewNS(t, func() {
		tbl := &nftables.Table{Name: "t", Family: nftables.TableFamilyINet}
		other := &nftables.Table{Name: "other", Family: nftables.TableFamilyINet}
		replace(t, other, func(c *nftables.Conn) { c.AddChain(&nftables.Chain{Name: "keep", Table: other}) })

		replace(t, tbl, nil)
		if !tableExists(t, tbl) {
			t.Fatal("Replace did not create the absent table")
		}
		replace(t, tbl, func(c *nftables.Conn) { c.AddChain(&nftables.Chain{Name: "old", Table: tbl}) })
		if got := chains(t, tbl); len(got) != 1 || got[0] != "old" {
			t.Fatalf("chains after the second Replace: %v, want [old]", got)
		}
		replace(t, tbl, func(c *nftables.Conn) { c.AddChain(&nftables.Chain{Name: "new", Table: tbl}) })
		if got := chains(t, tbl); len(got) != 1 || got[0] != "new" {
			t.Fatalf("chains after replacing a table holding [old]: %v, want [new]", got)
		}
		if got := chains(t, other); len(got) != 1 || got[0] != "keep" {
			t.Fatalf("the other table's chains: %v, want [keep]", got)
		}
	})
}

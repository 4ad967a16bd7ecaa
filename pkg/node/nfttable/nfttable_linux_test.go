package nfttable_test

import (
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/node/nfttable"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/google/nftables"
)

// inNewNS runs f in a fresh network namespace.
func inNewNS(t *testing.T, f func()) {
	t.Helper()
	nettest.RequireRoot(t)
	if err := nettest.In(nettest.NewNS(t), func() error { f(); return nil }); err != nil {
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
	if err := nfttable.Replace(c, tbl); err != nil {
		t.Fatal(err)
	}
	if then != nil {
		then(c)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flushing: %v", err)
	}
}

// chains lists the chains of tbl, nil if tbl does not exist.
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
	_, err = c.ListTableOfFamily(tbl.Name, tbl.Family)
	return err == nil
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

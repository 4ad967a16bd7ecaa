package cni_test

import (
	"bytes"
	"testing"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestDelWithConfigNowRefused: a pod added with a configuration that this
// version refuses (a newer rule, a hand edit after ADD) is still deleted
// completely, while ADD with that configuration fails.
func TestDelWithConfigNowRefused(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	good := env.Conf(latest, nil)
	pod := nettest.NewNS(t)
	if _, err := env.Add(good, "p1", pod); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(good, []byte(`"mtu":1500`), []byte(`"mtu":"big"`), 1)
	if bytes.Equal(bad, good) {
		t.Fatal("test configuration has no mtu to break")
	}
	if _, err := env.Add(bad, "p2", nettest.NewNS(t)); err == nil {
		t.Fatal("ADD accepted the refused configuration")
	}
	if err := env.Del(bad, "p1", pod); err != nil {
		t.Fatalf("DEL with the refused configuration: %v", err)
	}
	assertNSClean(t, pod)
}

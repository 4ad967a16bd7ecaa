package netconf

import "testing"

func TestParseForDeleteTakesWhatDecodes(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.0.0","name":"net","type":"cni-usernet","mtu":"big","gso":"turbo",
		"stateDir":"/s","runDir":"relative","tunName":"tun-x","ipam":{"type":"host-local"}}`)
	if _, err := Parse(conf); err == nil {
		t.Fatal("Parse accepted the bad configuration; the test needs one it refuses")
	}
	c, err := ParseForDelete(conf)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "net" || c.StateDir != "/s" || c.RunDir != DefaultRunDir || c.LogDir != DefaultLogDir ||
		c.TUNName != "tun-x" || c.IPAM.Type != "host-local" {
		t.Fatalf("got %+v", c)
	}
	if _, err := ParseForDelete([]byte(`[1]`)); err == nil {
		t.Fatal("not an object: want an error")
	}
}

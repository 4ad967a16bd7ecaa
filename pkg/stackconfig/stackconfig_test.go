package stackconfig

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/offload"
)

// TestRead: defaults filled in one place, a configuration written by an
// earlier version (negative checksum key, the TUN's inert keys) still loads
// with its meaning, and bad values are refused.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(v string) string {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := Read(write(`{"ifName":"eth0","specPath":"/s","controlSocket":"/c"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.TUNName != DefaultTUNName || c.TUNMTU != DefaultTUNMTU || c.GSO != offload.ModeAuto || c.WireQueueLen != DefaultQueueLen || c.Threads != DefaultThreads || c.VerifyRXChecksums {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = Read(write(`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","noRxChecksumOffload":true,"tunOffload":true,"appQueueLen":5,"wireQueueLen":-1,"udpIdle":"30s"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !c.VerifyRXChecksums || c.LegacyNoRXChecksumOffload || c.WireQueueLen != 0 || time.Duration(c.UDPIdle) != 30*time.Second {
		t.Fatalf("legacy configuration: %+v", c)
	}
	for _, bad := range []string{
		`{"ifName":"eth0","specPath":"/s"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","tunName":"eth0"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","tunMTU":100}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","wireQueueLen":-2}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","gso":"fast"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","threads":-1}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","udpIdle":"-1s"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","policy":true}`,
	} {
		if _, err := Read(write(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	// What the plugin writes reads back the same.
	want := Config{IfName: "eth0", SpecPath: "/s", ControlSocket: "/c", TUNName: "tun9", TUNMTU: 9000, GSO: offload.ModeSoftware, WireQueueLen: 7, Threads: 2, VerifyRXChecksums: true, MaxTCP: 3}
	b, _ := json.Marshal(want)
	got, err := Read(write(string(b)))
	if err != nil || *got != want {
		t.Fatalf("round trip: got %+v, %v; want %+v", got, err, want)
	}
}

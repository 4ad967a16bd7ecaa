package stackconfig

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
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
	if c.TUNName != DefaultTUNName || c.TUNMTU != DefaultTUNMTU || c.GSO != offload.ModeAuto || c.WireQueueLen != DefaultQueueLen || c.Threads != 0 || c.VerifyRXChecksums {
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
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","busyPoll":"-1us"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","busyPoll":"11ms"}`,
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

// TestReadVersions: a file without a version (written before it was
// versioned) and one of this version load; a newer one is refused with
// ErrNewer, so that the agent can say why it does not restart the stack.
func TestReadVersions(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		version string
		newer   bool
	}{{"", false}, {`"version":1,`, false}, {`"version":2,`, true}} {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(`{`+c.version+`"ifName":"eth0","specPath":"/s","controlSocket":"/c"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Read(p)
		if got := errors.Is(err, ErrNewer); got != c.newer || (err != nil && !c.newer) {
			t.Errorf("config with %q: err %v, want newer %v", c.version, err, c.newer)
		}
	}
	if Version != 1 {
		t.Errorf("Version %d: the cases above assume 1", Version)
	}
}

// TestBusyPollWindowGoverned: the pod's window (busyPollGoverned) is the
// governor's to switch, as the default is; the conflist's (busyPoll) is
// always on, in this version's files as in those written before the
// pod's window had its own key; off is off.
func TestBusyPollWindowGoverned(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		keys     string
		window   time.Duration
		governed bool
	}{
		{``, DefaultBusyPoll, true},
		{`"busyPollGoverned":"500us",`, 500 * time.Microsecond, true},
		{`"version":1,"busyPollGoverned":"1ms",`, time.Millisecond, true},
		{`"busyPoll":"200us",`, 200 * time.Microsecond, false},
		{`"version":1,"busyPoll":"50us",`, 50 * time.Microsecond, false},
		{`"busyPollOff":true,`, 0, false},
		{`"busyPollOff":true,"busyPollGoverned":"500us",`, 0, false},
	} {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(`{`+c.keys+`"ifName":"eth0","specPath":"/s","controlSocket":"/c"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Read(p)
		if err != nil {
			t.Fatalf("%s: %v", c.keys, err)
		}
		if w, g := cfg.BusyPollWindow(); w != c.window || g != c.governed {
			t.Errorf("%s: got window %s governed %v, want %s governed %v", c.keys, w, g, c.window, c.governed)
		}
	}
	for _, bad := range []string{
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","busyPollGoverned":"11ms"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","busyPollGoverned":"-1us"}`,
		`{"ifName":"eth0","specPath":"/s","controlSocket":"/c","busyPoll":"200us","busyPollGoverned":"200us"}`,
	} {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(p); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

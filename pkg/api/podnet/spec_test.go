package podnet

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
)

// TestSpecVersions: specs of version 1 (written by the stacks that spoke
// it) and of this version load; a newer one is refused with ErrNewer, and
// so is one without a version. A version-1 stack's own check (version !=
// 1) refuses this version, which is what keeps it out of a namespace
// shaped by this one.
func TestSpecVersions(t *testing.T) {
	if SpecVersion < 2 {
		t.Fatalf("SpecVersion %d: a stack up to 900993d (version 1) would run a pod shaped by this release", SpecVersion)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		version   int
		ok, newer bool
	}{{1, true, false}, {SpecVersion, true, false}, {SpecVersion + 1, false, true}, {0, false, false}} {
		s := &Spec{Version: c.version, IfName: "eth0", MTU: 1500, Addrs: []netip.Prefix{netip.MustParsePrefix("10.1.0.2/24")}}
		p := filepath.Join(dir, "spec.json")
		if err := WriteSpec(p, s); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSpec(p)
		if (err == nil) != c.ok || errors.Is(err, ErrNewer) != c.newer {
			t.Errorf("spec version %d: err %v, want ok %v, newer %v", c.version, err, c.ok, c.newer)
		}
	}
}

package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The meta plugins the agent chains after ours, as it writes them.
var (
	portmapObj   = []byte(`{"type":"portmap","capabilities":{"portMappings":true},"snat":true}`)
	bandwidthObj = []byte(`{"type":"bandwidth","capabilities":{"bandwidth":true}}`)
)

// helperOpts is opts with portmap and bandwidth to install (their
// binaries built from content) and, in chain mode, to chain after ours.
func (n *node) helperOpts(mode Mode, portmap, bandwidth string) Options {
	n.t.Helper()
	o := n.opts(mode)
	for _, h := range []struct{ name, content string }{{"portmap", portmap}, {"bandwidth", bandwidth}} {
		src := filepath.Join(filepath.Dir(n.source), h.name)
		if err := os.WriteFile(src, []byte("\x7fELF "+h.content), 0o755); err != nil {
			n.t.Fatal(err)
		}
		o.Helpers = append(o.Helpers, Helper{Name: h.name, Source: src})
	}
	if mode == Chain {
		o.After = [][]byte{portmapObj, bandwidthObj}
	}
	return o
}

// executable is binaryState of a file with content and mode 0755.
func executable(content string) string { return fmt.Sprintf("%q %v", content, fs.FileMode(0o755)) }

func mustInstallBinary(t *testing.T, o Options, wantChanged bool) {
	t.Helper()
	changed, err := InstallBinary(o)
	if err != nil {
		t.Fatalf("InstallBinary: %v", err)
	}
	if changed != wantChanged {
		t.Fatalf("InstallBinary: got changed=%v, want %v", changed, wantChanged)
	}
}

// TestHelpersFreshNode: a node without portmap and bandwidth gets ours;
// a second run writes nothing, a new build replaces them by rename, and
// uninstall leaves the plugin directory as it was.
func TestHelpersFreshNode(t *testing.T) {
	n := newNode(t)
	before := snapshot(t, n.binDir)
	o := n.helperOpts(Standalone, "portmap v1", "bandwidth v1")
	mustInstallBinary(t, o, true)
	for _, name := range []string{"portmap", "bandwidth"} {
		if got, want := binaryState(t, filepath.Join(n.binDir, name)), executable("\x7fELF "+name+" v1"); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	pm := filepath.Join(n.binDir, "portmap")
	s := stampOf(t, pm)
	time.Sleep(10 * time.Millisecond)
	mustInstallBinary(t, o, false)
	if stampOf(t, pm) != s {
		t.Error("identical portmap rewritten")
	}

	o = n.helperOpts(Standalone, "portmap v2", "bandwidth v1")
	mustInstallBinary(t, o, true)
	if got := stampOf(t, pm); got.ino == s.ino {
		t.Error("new portmap written in place, want a rename")
	}
	if got, want := binaryState(t, pm), executable("\x7fELF portmap v2"); got != want {
		t.Errorf("portmap after upgrade: got %q, want %q", got, want)
	}
	noTemps(t, n.binDir)
	mustUninstall(t, o)
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
}

// TestHelpersNodesOwnKept: a portmap the node had (its distribution's,
// or a link to it) is neither replaced nor removed; the missing
// bandwidth is installed and removed again.
func TestHelpersNodesOwnKept(t *testing.T) {
	for _, link := range []bool{false, true} {
		name := "file"
		if link {
			name = "link"
		}
		t.Run(name, func(t *testing.T) {
			n := newNode(t)
			pm := filepath.Join(n.binDir, "portmap")
			if link {
				dist := filepath.Join(filepath.Dir(n.binDir), "portmap.dist")
				if err := os.WriteFile(dist, []byte("distribution's portmap"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(dist, pm); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(pm, []byte("distribution's portmap"), 0o750); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, n.binDir)
			o := n.helperOpts(Standalone, "portmap v1", "bandwidth v1")
			mustInstallBinary(t, o, true)
			if got := snapshot(t, n.binDir)["portmap"]; got != before["portmap"] {
				t.Errorf("node's portmap: got %+v, want it untouched %+v", got, before["portmap"])
			}
			if got := binaryState(t, filepath.Join(n.binDir, "bandwidth")); got != executable("\x7fELF bandwidth v1") {
				t.Errorf("bandwidth: got %q", got)
			}
			// A new build of ours does not replace the node's either.
			o = n.helperOpts(Standalone, "portmap v2", "bandwidth v1")
			mustInstallBinary(t, o, false)
			mustUninstall(t, o)
			sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
		})
	}
}

// TestHelperReplacedAfterUs: a portmap someone installed over ours (a
// package of the node's) is theirs: not updated, not removed.
func TestHelperReplacedAfterUs(t *testing.T) {
	n := newNode(t)
	o := n.helperOpts(Standalone, "portmap v1", "bandwidth v1")
	mustInstallBinary(t, o, true)
	pm := filepath.Join(n.binDir, "portmap")
	if err := os.WriteFile(pm+".new", []byte("package's portmap"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pm+".new", pm); err != nil {
		t.Fatal(err)
	}
	o = n.helperOpts(Standalone, "portmap v2", "bandwidth v1")
	mustInstallBinary(t, o, false)
	mustUninstall(t, o)
	if got := binaryState(t, pm); got != executable("package's portmap") {
		t.Errorf("portmap after uninstall: got %q, want the package's", got)
	}
	if got := binaryState(t, filepath.Join(n.binDir, "bandwidth")); got != "absent" {
		t.Errorf("bandwidth after uninstall: got %q, want it removed", got)
	}
}

// TestHelpersBadInput: a helper without a source, with our own name or a
// path as name, or a missing source file, is refused before anything is
// written.
func TestHelpersBadInput(t *testing.T) {
	for _, h := range []Helper{
		{Name: "portmap"},
		{Name: "cni-usernet", Source: "/bin/true"},
		{Name: "cni-usernet-stack", Source: "/bin/true"},
		{Name: "../portmap", Source: "/bin/true"},
		{Name: "", Source: "/bin/true"},
		{Name: "portmap", Source: "/nonexistent/portmap"},
	} {
		n := newNode(t)
		before := snapshot(t, n.binDir)
		o := n.opts(Standalone)
		o.Helpers = []Helper{h}
		if _, err := InstallBinary(o); err == nil {
			t.Errorf("helper %+v: no error", h)
		}
		sameSnapshot(t, "bin dir", snapshot(t, n.binDir), before)
		if _, err := os.Stat(n.record); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("helper %+v: record written (err %v)", h, err)
		}
	}
}

// TestChainAddsWhatIsMissing: portmap goes after our entry and bandwidth
// just before it (it looks for the veth our ADD moves away), each only
// when the primary's list lacks its type; a second run changes
// nothing; uninstall restores the file byte for byte.
func TestChainAddsWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		file  string
		types []string
	}{
		{"10-flannel.conflist", []string{"flannel", "portmap", "bandwidth", "cni-usernet"}},
		{"10-calico.conflist", []string{"calico", "portmap", "bandwidth", "cni-usernet"}},
		{"05-cilium.conflist", []string{"cilium-cni", "bandwidth", "cni-usernet", "portmap"}},
		{"10-flannel.conf", []string{"flannel", "bandwidth", "cni-usernet", "portmap"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			n := newNode(t)
			n.put(tc.file)
			before := snapshot(t, n.confDir)
			o := n.helperOpts(Chain, "portmap v1", "bandwidth v1")
			name, changed := mustInstall(t, o)
			if !changed {
				t.Fatal("no change")
			}
			got := n.read(name)
			if types := pluginTypes(t, got); !slices.Equal(types, tc.types) {
				t.Errorf("plugins: got %v, want %v", types, tc.types)
			}
			if tc.file == "10-flannel.conflist" {
				// flannel's own portmap is left as it is.
				l, _ := parseConflist(got)
				if !sameJSON(l.plugins[1], []byte(`{"type":"portmap","capabilities":{"portMappings":true}}`)) {
					t.Errorf("flannel's portmap: got %s", l.plugins[1])
				}
			}
			s := stampOf(t, filepath.Join(n.confDir, name))
			time.Sleep(10 * time.Millisecond)
			if _, changed := mustInstall(t, o); changed {
				t.Error("second run: changed")
			}
			if stampOf(t, filepath.Join(n.confDir, name)) != s {
				t.Error("second run rewrote the configuration")
			}
			mustUninstall(t, o)
			sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
		})
	}
}

// TestChainAfterSwitchedOff: --bandwidth=false on a node where we had
// added bandwidth takes our entry out again, and only ours.
func TestChainAfterSwitchedOff(t *testing.T) {
	n := newNode(t)
	n.put("10-flannel.conflist")
	before := snapshot(t, n.confDir)
	o := n.helperOpts(Chain, "portmap v1", "bandwidth v1")
	mustInstall(t, o)
	o.After = [][]byte{portmapObj}
	if _, changed := mustInstall(t, o); !changed {
		t.Fatal("bandwidth switched off: no change")
	}
	if types := pluginTypes(t, n.read("10-flannel.conflist")); !slices.Equal(types, []string{"flannel", "portmap", "cni-usernet"}) {
		t.Errorf("plugins: got %v, want our bandwidth gone and flannel's portmap kept", types)
	}
	o.After = nil
	if _, changed := mustInstall(t, o); changed {
		t.Error("portmap switched off: changed flannel's own portmap")
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

// TestChainRewrittenKeepingOurs: flannel's installer rewrites its list
// keeping our entries (and changing its own); uninstall takes out ours,
// the bandwidth we added included, and keeps their change.
func TestChainRewrittenKeepingOurs(t *testing.T) {
	n := newNode(t)
	n.put("10-flannel.conflist")
	o := n.helperOpts(Chain, "portmap v1", "bandwidth v1")
	mustInstall(t, o)
	edited := bytes.Replace(n.read("10-flannel.conflist"), []byte(`"hairpinMode": true`), []byte(`"hairpinMode": false`), 1)
	n.write("10-flannel.conflist", edited, 0o644)
	// The agent's next round: nothing to add, the record captures the
	// rewrite.
	mustInstall(t, o)
	mustUninstall(t, o)
	got := n.read("10-flannel.conflist")
	if types := pluginTypes(t, got); !slices.Equal(types, []string{"flannel", "portmap"}) {
		t.Errorf("plugins: got %v, want flannel's own", types)
	}
	want := bytes.Replace(testdata(t, "10-flannel.conflist"), []byte(`"hairpinMode": true`), []byte(`"hairpinMode": false`), 1)
	if !sameJSON(got, want) {
		t.Errorf("got\n%s\nwant flannel's edit kept\n%s", got, want)
	}
}

// TestChainAfterBadInput: an object to chain after ours without a type,
// or of our own type, is refused and the directory stays as it was.
func TestChainAfterBadInput(t *testing.T) {
	for _, obj := range []string{`{"capabilities":{"portMappings":true}}`, `{"type":"cni-usernet"}`, `not json`} {
		n := newNode(t)
		n.put("10-flannel.conflist")
		before := snapshot(t, n.confDir)
		o := n.opts(Chain)
		o.After = [][]byte{[]byte(obj)}
		if _, _, err := InstallConfig(o); err == nil {
			t.Errorf("After %s: no error", obj)
		}
		sameSnapshot(t, "conf dir", snapshot(t, n.confDir), before)
	}
}

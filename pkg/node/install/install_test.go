package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
	"github.com/containernetworking/cni/libcni"
)

// node is a fake node: a plugin directory, a configuration directory and
// the agent's state directory, all under one temporary directory.
type node struct {
	t       *testing.T
	binDir  string
	confDir string
	record  string
	source  string
	// stack is the stack's binary to install, used by stackOpts only.
	stack string
}

func newNode(t *testing.T) *node {
	t.Helper()
	root := t.TempDir()
	n := &node{
		t:       t,
		binDir:  filepath.Join(root, "opt/cni/bin"),
		confDir: filepath.Join(root, "etc/cni/net.d"),
		record:  filepath.Join(root, "var/lib/cni-usernet", RecordName),
		source:  filepath.Join(root, "build/cni-usernet"),
		stack:   filepath.Join(root, "build/cni-usernet-stack"),
	}
	for _, d := range []string{n.binDir, n.confDir, filepath.Dir(n.source)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.setSource("binary v1")
	n.setStack("stack v1")
	return n
}

func (n *node) setStack(content string) {
	n.t.Helper()
	if err := os.WriteFile(n.stack, []byte("\x7fELF "+content), 0o755); err != nil {
		n.t.Fatal(err)
	}
}

// stackOpts is opts with the stack's binary to install too.
func (n *node) stackOpts(mode Mode) Options {
	o := n.opts(mode)
	o.StackSource = n.stack
	return o
}

func (n *node) setSource(content string) {
	n.t.Helper()
	if err := os.WriteFile(n.source, []byte("\x7fELF "+content), 0o755); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) opts(mode Mode) Options {
	o := Options{
		Source: n.source, BinDir: n.binDir, ConfDir: n.confDir, Name: "cni-usernet",
		Mode: mode, RecordPath: n.record,
	}
	switch mode {
	case Standalone:
		o.Conflist = testdata(n.t, "standalone.conflist")
	case Chain:
		o.Plugin = testdata(n.t, "chained-plugin.json")
	}
	return o
}

func testdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// put copies testdata files into the configuration directory.
func (n *node) put(names ...string) {
	n.t.Helper()
	for _, name := range names {
		n.write(name, testdata(n.t, name), 0o644)
	}
}

func (n *node) write(name string, data []byte, mode fs.FileMode) {
	n.t.Helper()
	p := filepath.Join(n.confDir, name)
	if err := os.WriteFile(p, data, mode); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) read(name string) []byte {
	n.t.Helper()
	data, err := os.ReadFile(filepath.Join(n.confDir, name))
	if err != nil {
		n.t.Fatal(err)
	}
	return data
}

// first is the configuration containerd would use.
func (n *node) first() string {
	n.t.Helper()
	files, err := confFiles(n.confDir)
	if err != nil {
		n.t.Fatal(err)
	}
	if len(files) == 0 {
		return ""
	}
	return filepath.Base(files[0])
}

// fileState is everything about a file that Uninstall must restore.
type fileState struct {
	data     string
	mode     fs.FileMode
	uid, gid uint32
}

// snapshot takes the state of every file in dir, dot files included (a
// temporary file left behind is a difference too).
func snapshot(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := map[string]fileState{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		fs := fileState{mode: fi.Mode(), uid: st.Uid, gid: st.Gid}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			fs.data = string(data)
		}
		s[e.Name()] = fs
	}
	return s
}

func sameSnapshot(t *testing.T, what string, got, want map[string]fileState) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: %s is gone, want it back", what, name)
		case g.data != w.data:
			t.Errorf("%s: %s has\n%s\nwant\n%s", what, name, g.data, w.data)
		case g.mode != w.mode || g.uid != w.uid || g.gid != w.gid:
			t.Errorf("%s: %s has mode %v owner %d:%d, want %v %d:%d", what, name, g.mode, g.uid, g.gid, w.mode, w.uid, w.gid)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: %s is left over", what, name)
		}
	}
}

// stamp identifies one version of a file: a rewrite, even with the same
// bytes, changes the inode (rename) or the modification time.
type stamp struct {
	ino   uint64
	mtime time.Time
}

func stampOf(t *testing.T, path string) stamp {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return stamp{fi.Sys().(*syscall.Stat_t).Ino, fi.ModTime()}
}

func noTemps(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp") {
				t.Errorf("temporary file %s left in %s", e.Name(), d)
			}
		}
	}
}

func pluginTypes(t *testing.T, data []byte) []string {
	t.Helper()
	l, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("result does not load with libcni: %v\n%s", err, data)
	}
	var types []string
	for _, p := range l.Plugins {
		types = append(types, p.Network.Type)
	}
	return types
}

func keys(t *testing.T, data []byte) []string {
	t.Helper()
	o, err := parseObject(data)
	if err != nil {
		t.Fatal(err)
	}
	var k []string
	for _, m := range o {
		k = append(k, m.key)
	}
	return k
}

func mustInstall(t *testing.T, o Options) (string, bool) {
	t.Helper()
	path, changed, err := InstallConfig(o)
	if err != nil {
		t.Fatalf("InstallConfig: %v", err)
	}
	return filepath.Base(path), changed
}

func mustUninstall(t *testing.T, o Options) {
	t.Helper()
	if err := Uninstall(o); err != nil {
		t.Fatalf("Uninstall: %v", err)
	}
	if _, err := os.Stat(o.RecordPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("record %s still there after Uninstall (err %v)", o.RecordPath, err)
	}
}

func TestStandaloneIntoEmptyDir(t *testing.T) {
	n := newNode(t)
	o := n.opts(Standalone)
	confBefore, binBefore := snapshot(t, n.confDir), snapshot(t, n.binDir)

	changed, err := InstallBinary(o)
	if err != nil || !changed {
		t.Fatalf("InstallBinary: got changed=%v err=%v, want a change", changed, err)
	}
	name, changed := mustInstall(t, o)
	if name != "05-cni-usernet.conflist" || !changed {
		t.Fatalf("InstallConfig: got %s changed=%v, want 05-cni-usernet.conflist changed", name, changed)
	}
	if got, want := n.read(name), o.Conflist; !bytes.Equal(got, want) {
		t.Errorf("conflist: got\n%s\nwant\n%s", got, want)
	}
	if fi, _ := os.Stat(filepath.Join(n.confDir, name)); fi.Mode() != 0o644 {
		t.Errorf("conflist mode: got %v, want 0644", fi.Mode())
	}
	bin := filepath.Join(n.binDir, "cni-usernet")
	fi, err := os.Stat(bin)
	if err != nil || fi.Mode() != 0o755 {
		t.Fatalf("binary: got %v, %v, want mode 0755", fi, err)
	}
	if got, _ := os.ReadFile(bin); string(got) != "\x7fELF binary v1" {
		t.Errorf("binary content: got %q", got)
	}
	noTemps(t, n.confDir, n.binDir, filepath.Dir(n.record))

	// A second run changes nothing: not the files, not the record.
	stamps := map[string]stamp{}
	for _, p := range []string{bin, filepath.Join(n.confDir, name), n.record} {
		stamps[p] = stampOf(t, p)
	}
	time.Sleep(10 * time.Millisecond)
	if changed, err := InstallBinary(o); err != nil || changed {
		t.Errorf("second InstallBinary: got changed=%v err=%v, want no change", changed, err)
	}
	if name2, changed := mustInstall(t, o); changed || name2 != name {
		t.Errorf("second InstallConfig: got %s changed=%v, want %s unchanged", name2, changed, name)
	}
	for p, s := range stamps {
		if got := stampOf(t, p); got != s {
			t.Errorf("%s was rewritten by the second run: %+v, want %+v", p, got, s)
		}
	}

	mustUninstall(t, o)
	sameSnapshot(t, "conf dir after uninstall", snapshot(t, n.confDir), confBefore)
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), binBefore)
	if err := Uninstall(o); err != nil {
		t.Errorf("second Uninstall: %v, want nothing to do", err)
	}
}

func TestStandaloneSortsFirst(t *testing.T) {
	tests := []struct {
		name   string
		others []string
		want   string
	}{
		{"behind ours", []string{"10-calico.conflist", "87-podman-bridge.conflist", "99-loopback.conf"}, "05-cni-usernet.conflist"},
		{"others are links", []string{"10-calico.conflist@", "99-loopback.conf"}, "05-cni-usernet.conflist"},
		// "05-ci" sorts before "05-cn": Cilium's own name would win.
		{"cilium first", []string{"05-cilium.conflist", "10-calico.conflist"}, "00-cni-usernet.conflist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			for i, other := range tt.others {
				if link, ok := strings.CutSuffix(other, "@"); ok {
					// As some distributions ship them: a link to a file
					// elsewhere.
					real := filepath.Join(t.TempDir(), link)
					os.WriteFile(real, testdata(t, link), 0o644)
					if err := os.Symlink(real, filepath.Join(n.confDir, link)); err != nil {
						t.Fatal(err)
					}
					tt.others[i] = link
					continue
				}
				n.put(other)
			}
			before := snapshot(t, n.confDir)
			o := n.opts(Standalone)
			name, changed := mustInstall(t, o)
			if name != tt.want || !changed {
				t.Fatalf("got %s changed=%v, want %s changed", name, changed, tt.want)
			}
			if n.first() != tt.want {
				t.Errorf("containerd would use %s, want %s", n.first(), tt.want)
			}
			for _, other := range tt.others {
				if got := n.read(other); !bytes.Equal(got, testdata(t, other)) {
					t.Errorf("%s changed:\n%s", other, got)
				}
			}
			mustUninstall(t, o)
			sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
		})
	}
}

// TestStandaloneOvertaken: another installer adds a file that sorts
// before ours; the next run moves our conflist in front of it and does
// not leave the old one behind.
func TestStandaloneOvertaken(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	before := snapshot(t, n.confDir)
	o := n.opts(Standalone)
	mustInstall(t, o)
	n.put("05-cilium.conflist")
	before["05-cilium.conflist"] = snapshot(t, n.confDir)["05-cilium.conflist"]

	name, changed := mustInstall(t, o)
	if name != "00-cni-usernet.conflist" || !changed {
		t.Fatalf("got %s changed=%v, want 00-cni-usernet.conflist changed", name, changed)
	}
	if _, err := os.Stat(filepath.Join(n.confDir, "05-cni-usernet.conflist")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old 05-cni-usernet.conflist left behind (err %v)", err)
	}
	// Stable from now on, even though 05- would sort first again once
	// Cilium's file goes.
	if _, changed := mustInstall(t, o); changed {
		t.Errorf("third run changed something")
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

// TestStandaloneReplacesSameName: a file already named like ours (a hand
// install) is replaced, keeps its mode, and comes back on uninstall.
func TestStandaloneReplacesSameName(t *testing.T) {
	n := newNode(t)
	n.write("05-cni-usernet.conflist", []byte(`{"cniVersion":"1.0.0","name":"old","plugins":[{"type":"cni-usernet"}]}`), 0o600)
	before := snapshot(t, n.confDir)
	o := n.opts(Standalone)
	mustInstall(t, o)
	if got := n.read("05-cni-usernet.conflist"); !bytes.Equal(got, o.Conflist) {
		t.Errorf("got\n%s\nwant ours", got)
	}
	if fi, _ := os.Stat(filepath.Join(n.confDir, "05-cni-usernet.conflist")); fi.Mode() != 0o600 {
		t.Errorf("mode: got %v, want the replaced file's 0600", fi.Mode())
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

func TestStandaloneRefused(t *testing.T) {
	tests := []struct {
		name     string
		files    []string
		conflist string
		want     string
		is       error
	}{
		{"another file sorts before 00-", []string{"10-calico.conflist"}, "", "00-aaa.conflist", ErrNotFirst},
		{"not JSON", nil, `{"cniVersion":`, "checking the conflist", nil},
		{"no plugins", nil, `{"cniVersion":"1.0.0","name":"x"}`, "no inline", nil},
		{"without our plugin", nil, `{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}`, `no plugin of type "cni-usernet"`, nil},
		{"version we do not speak", nil, `{"cniVersion":"0.2.0","name":"x","plugins":[{"type":"cni-usernet"}]}`, `cniVersion "0.2.0"`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.put(tt.files...)
			if tt.is == ErrNotFirst {
				n.write("00-aaa.conflist", testdata(t, "05-cilium.conflist"), 0o644)
			}
			before := snapshot(t, n.confDir)
			o := n.opts(Standalone)
			if tt.conflist != "" {
				o.Conflist = []byte(tt.conflist)
			}
			_, _, err := InstallConfig(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("got %v, want errors.Is %v", err, tt.is)
			}
			sameSnapshot(t, "after refusal", snapshot(t, n.confDir), before)
			if _, err := os.Stat(n.record); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused install wrote a record (err %v)", err)
			}
		})
	}
}

func TestBinary(t *testing.T) {
	n := newNode(t)
	o := n.opts(Standalone)
	bin := filepath.Join(n.binDir, "cni-usernet")
	if _, err := InstallBinary(o); err != nil {
		t.Fatal(err)
	}
	s1 := stampOf(t, bin)

	// Identical content: not even opened for writing.
	time.Sleep(10 * time.Millisecond)
	if changed, err := InstallBinary(o); err != nil || changed {
		t.Fatalf("identical: got changed=%v err=%v, want no change", changed, err)
	}
	if got := stampOf(t, bin); got != s1 {
		t.Errorf("identical binary rewritten: %+v, want %+v", got, s1)
	}

	// A new build replaces it by rename: a process that had the old file
	// open keeps reading the old content.
	old, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	n.setSource("binary v2, longer than v1")
	if changed, err := InstallBinary(o); err != nil || !changed {
		t.Fatalf("new build: got changed=%v err=%v, want a change", changed, err)
	}
	if got := stampOf(t, bin); got.ino == s1.ino {
		t.Errorf("new binary written in place (inode %d kept), want a rename", got.ino)
	}
	if got, _ := os.ReadFile(bin); string(got) != "\x7fELF binary v2, longer than v1" {
		t.Errorf("binary: got %q", got)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(old); err != nil || buf.String() != "\x7fELF binary v1" {
		t.Errorf("old open file: got %q, %v, want the old content", buf.String(), err)
	}
	if fi, _ := os.Stat(bin); fi.Mode() != 0o755 {
		t.Errorf("mode: got %v, want 0755", fi.Mode())
	}
	noTemps(t, n.binDir)

	// An upgrade keeps the record of the first install: nothing was here.
	mustUninstall(t, o)
	if _, err := os.Stat(bin); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("binary we created still there after uninstall (err %v)", err)
	}
}

// TestBinaryReplacedRestored: a binary that was there before (a hand
// install of an older version) comes back byte for byte, with its mode.
func TestBinaryReplacedRestored(t *testing.T) {
	n := newNode(t)
	bin := filepath.Join(n.binDir, "cni-usernet")
	if err := os.WriteFile(bin, []byte("hand-installed"), 0o750); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, n.binDir)
	o := n.opts(Standalone)
	for _, v := range []string{"v1", "v2"} {
		n.setSource(v)
		if changed, err := InstallBinary(o); err != nil || !changed {
			t.Fatalf("install %s: got changed=%v err=%v", v, changed, err)
		}
	}
	if fi, _ := os.Stat(bin); fi.Mode() != 0o755 {
		t.Errorf("mode: got %v, want 0755", fi.Mode())
	}
	mustUninstall(t, o)
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
	if _, err := os.Stat(backupPath(n.record, "cni-usernet")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("backup of the old binary left behind (err %v)", err)
	}
}

// TestBinaryAlreadyThere: the same binary installed by someone else is
// not ours: no write, no record, and uninstall leaves it.
func TestBinaryAlreadyThere(t *testing.T) {
	n := newNode(t)
	bin := filepath.Join(n.binDir, "cni-usernet")
	src, _ := os.ReadFile(n.source)
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	o := n.opts(Standalone)
	if changed, err := InstallBinary(o); err != nil || changed {
		t.Fatalf("got changed=%v err=%v, want no change", changed, err)
	}
	mustUninstall(t, o)
	if got, err := os.ReadFile(bin); err != nil || !bytes.Equal(got, src) {
		t.Errorf("binary after uninstall: %q, %v, want it untouched", got, err)
	}
}

// binaryState is the content and mode of a file in BinDir, or "absent".
func binaryState(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	return fmt.Sprintf("%q %v", data, fi.Mode())
}

// TestStackFreshInstall: both binaries land with mode 0755, and an
// Uninstall given only what the uninstall command has takes both away.
func TestStackFreshInstall(t *testing.T) {
	n := newNode(t)
	before := snapshot(t, n.binDir)
	o := n.stackOpts(Standalone)
	if changed, err := InstallBinary(o); err != nil || !changed {
		t.Fatalf("InstallBinary: got changed=%v err=%v, want a change", changed, err)
	}
	for name, want := range map[string]string{"cni-usernet": "\x7fELF binary v1", StackName("cni-usernet"): "\x7fELF stack v1"} {
		p := filepath.Join(n.binDir, name)
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode() != 0o755 {
			t.Errorf("%s: got %v, %v, want a file with mode 0755", name, fi, err)
			continue
		}
		if got, _ := os.ReadFile(p); string(got) != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	noTemps(t, n.binDir, filepath.Dir(n.record))
	rec, err := loadRecord(n.record)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Binary == nil || rec.Stack == nil || rec.Binary.Existed || rec.Stack.Existed {
		t.Errorf("record: binary %+v stack %+v, want both recorded as created", rec.Binary, rec.Stack)
	}

	mustUninstall(t, Options{Name: o.Name, RecordPath: o.RecordPath, BinDir: o.BinDir})
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
}

// TestStackInstalledFirst: when the plugin binary is about to change, the
// new stack binary is already in place.
func TestStackInstalledFirst(t *testing.T) {
	n := newNode(t)
	bin, stack := filepath.Join(n.binDir, "cni-usernet"), filepath.Join(n.binDir, "cni-usernet-stack")
	var seen []string
	crashAfterRecord = func() error {
		seen = append(seen, binaryState(t, bin)+" / "+binaryState(t, stack))
		return nil
	}
	defer func() { crashAfterRecord = nil }()
	if _, err := InstallBinary(n.stackOpts(Standalone)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"absent / absent",
		`absent / "\x7fELF stack v1" -rwxr-xr-x`,
	}
	if !slices.Equal(seen, want) {
		t.Errorf("before each change (plugin / stack): got %q, want %q", seen, want)
	}
}

// TestStackReplacedRestored: binaries that were there before (a hand
// install of an older version) come back byte for byte, with mode and
// owner, each from a backup of its own.
func TestStackReplacedRestored(t *testing.T) {
	n := newNode(t)
	bin, stack := filepath.Join(n.binDir, "cni-usernet"), filepath.Join(n.binDir, "cni-usernet-stack")
	if err := os.WriteFile(bin, []byte("hand-installed plugin"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stack, []byte("hand-installed stack"), 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(stack, 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, n.binDir)
	o := n.stackOpts(Standalone)
	for _, v := range []string{"v1", "v2"} {
		n.setSource("binary " + v)
		n.setStack("stack " + v)
		if changed, err := InstallBinary(o); err != nil || !changed {
			t.Fatalf("install %s: got changed=%v err=%v", v, changed, err)
		}
	}
	after := snapshot(t, n.binDir)
	if g, w := after["cni-usernet-stack"], before["cni-usernet-stack"]; g.data != "\x7fELF stack v2" || g.mode != 0o755 || g.uid != w.uid || g.gid != w.gid {
		t.Errorf("stack binary: got %q %v %d:%d, want v2, 0755, owner %d:%d kept", g.data, g.mode, g.uid, g.gid, w.uid, w.gid)
	}
	if g := after["cni-usernet"]; g.data != "\x7fELF binary v2" || g.mode != 0o755 {
		t.Errorf("plugin binary: got %q %v, want v2, 0755", g.data, g.mode)
	}
	backups := []string{backupPath(n.record, "cni-usernet"), backupPath(n.record, StackName("cni-usernet"))}
	if backups[0] == backups[1] {
		t.Fatalf("one backup path for both binaries: %s", backups[0])
	}
	for i, want := range []string{"hand-installed plugin", "hand-installed stack"} {
		if got, err := os.ReadFile(backups[i]); err != nil || string(got) != want {
			t.Errorf("backup %s: got %q, %v, want %q", backups[i], got, err, want)
		}
	}

	mustUninstall(t, Options{Name: o.Name, RecordPath: o.RecordPath, BinDir: o.BinDir})
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
	for _, b := range backups {
		if _, err := os.Stat(b); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("backup %s left behind (err %v)", b, err)
		}
	}
}

// TestStackReinstall: identical binaries are not rewritten, and a new
// stack build alone replaces only the stack binary.
func TestStackReinstall(t *testing.T) {
	n := newNode(t)
	o := n.stackOpts(Standalone)
	bin, stack := filepath.Join(n.binDir, "cni-usernet"), filepath.Join(n.binDir, "cni-usernet-stack")
	if _, err := InstallBinary(o); err != nil {
		t.Fatal(err)
	}
	stamps := func() map[string]stamp {
		return map[string]stamp{bin: stampOf(t, bin), stack: stampOf(t, stack), n.record: stampOf(t, n.record)}
	}
	s1 := stamps()

	time.Sleep(10 * time.Millisecond)
	if changed, err := InstallBinary(o); err != nil || changed {
		t.Fatalf("identical: got changed=%v err=%v, want no change", changed, err)
	}
	if got := stamps(); !maps.Equal(got, s1) {
		t.Errorf("identical binaries rewritten: %+v, want %+v", got, s1)
	}

	n.setStack("stack v2")
	if changed, err := InstallBinary(o); err != nil || !changed {
		t.Fatalf("new stack build: got changed=%v err=%v, want a change", changed, err)
	}
	s2 := stamps()
	if s2[stack] == s1[stack] {
		t.Error("new stack build: stack binary not rewritten")
	}
	if got, _ := os.ReadFile(stack); string(got) != "\x7fELF stack v2" {
		t.Errorf("stack binary: got %q", got)
	}
	// The record already says what was there before the first install.
	if s2[bin] != s1[bin] || s2[n.record] != s1[n.record] {
		t.Errorf("new stack build rewrote the plugin binary or the record")
	}
	noTemps(t, n.binDir)
	mustUninstall(t, o)
	for _, p := range []string{bin, stack} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there after uninstall (err %v)", p, err)
		}
	}
}

// TestStackNotRegular: something other than a file where the stack
// binary goes is not ours to replace, and the plugin binary is not
// upgraded without it.
func TestStackNotRegular(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", func(t *testing.T, path string) {
			real := filepath.Join(t.TempDir(), "cni-usernet-stack")
			os.WriteFile(real, []byte("elsewhere"), 0o755)
			if err := os.Symlink(real, path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			bin, stack := filepath.Join(n.binDir, "cni-usernet"), filepath.Join(n.binDir, "cni-usernet-stack")
			if _, err := InstallBinary(n.opts(Standalone)); err != nil {
				t.Fatal(err)
			}
			tt.setup(t, stack)
			binBefore := snapshot(t, n.binDir)
			recBefore, _ := os.ReadFile(n.record)
			s := stampOf(t, bin)

			n.setSource("binary v2")
			changed, err := InstallBinary(n.stackOpts(Standalone))
			if err == nil || !strings.Contains(err.Error(), "stack binary") || !strings.Contains(err.Error(), "not a regular file") {
				t.Fatalf("got changed=%v err=%v, want an error about the stack binary not being a regular file", changed, err)
			}
			if changed {
				t.Error("changed reported for a refused install")
			}
			sameSnapshot(t, "bin dir after refusal", snapshot(t, n.binDir), binBefore)
			if stampOf(t, bin) != s {
				t.Error("plugin binary rewritten")
			}
			if rec, _ := os.ReadFile(n.record); !bytes.Equal(rec, recBefore) {
				t.Errorf("record changed by a refused install:\n%s\nwas\n%s", rec, recBefore)
			}
		})
	}
}

// TestStackOldRecord: a record written before there was a stack binary
// (no "stack") still uninstalls, and an upgrade installing the stack
// binary over it records it too.
func TestStackOldRecord(t *testing.T) {
	// oldRecord is a record as the installer wrote it before the stack
	// binary: the plugin binary replaced a hand-installed one.
	oldRecord := func(n *node) {
		n.t.Helper()
		bin := filepath.Join(n.binDir, "cni-usernet")
		if err := os.MkdirAll(filepath.Dir(n.record), 0o755); err != nil {
			n.t.Fatal(err)
		}
		if err := os.WriteFile(backupPath(n.record, "cni-usernet"), []byte("hand-installed"), 0o600); err != nil {
			n.t.Fatal(err)
		}
		rec := fmt.Sprintf(`{
  "version": 1,
  "binDir": %q,
  "binary": {
    "existed": true,
    "backup": %q,
    "meta": {
      "mode": 488,
      "uid": %d,
      "gid": %d
    }
  }
}
`, n.binDir, filepath.Base(backupPath(n.record, "cni-usernet")), os.Geteuid(), os.Getegid())
		if err := os.WriteFile(n.record, []byte(rec), 0o600); err != nil {
			n.t.Fatal(err)
		}
		if err := os.WriteFile(bin, []byte("\x7fELF binary v1"), 0o755); err != nil {
			n.t.Fatal(err)
		}
	}
	want := map[string]fileState{"cni-usernet": {data: "hand-installed", mode: 0o750, uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}}
	t.Run("uninstall", func(t *testing.T) {
		n := newNode(t)
		oldRecord(n)
		mustUninstall(t, Options{Name: "cni-usernet", RecordPath: n.record})
		sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), want)
	})
	t.Run("upgrade, then uninstall", func(t *testing.T) {
		n := newNode(t)
		oldRecord(n)
		if changed, err := InstallBinary(n.stackOpts(Standalone)); err != nil || !changed {
			t.Fatalf("InstallBinary: got changed=%v err=%v, want the stack binary installed", changed, err)
		}
		rec, err := loadRecord(n.record)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Stack == nil || rec.Stack.Existed || rec.Binary == nil || !rec.Binary.Existed {
			t.Errorf("record: binary %+v stack %+v, want the old binary entry kept and the stack recorded as created", rec.Binary, rec.Stack)
		}
		mustUninstall(t, Options{Name: "cni-usernet", RecordPath: n.record})
		sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), want)
	})
}

// TestCrashBetweenStackAndPlugin: the new stack binary is in place, the
// record of the plugin binary is written, the plugin binary is not
// replaced. Uninstall still restores both.
func TestCrashBetweenStackAndPlugin(t *testing.T) {
	for _, replacing := range []bool{false, true} {
		t.Run(fmt.Sprintf("replacing=%v", replacing), func(t *testing.T) {
			n := newNode(t)
			bin, stack := filepath.Join(n.binDir, "cni-usernet"), filepath.Join(n.binDir, "cni-usernet-stack")
			if replacing {
				os.WriteFile(bin, []byte("old"), 0o755)
				os.WriteFile(stack, []byte("old stack"), 0o755)
			}
			before := snapshot(t, n.binDir)
			saves := 0
			crashAfterRecord = func() error {
				if saves++; saves == 2 {
					return errCrash
				}
				return nil
			}
			_, err := InstallBinary(n.stackOpts(Standalone))
			crashAfterRecord = nil
			if !errors.Is(err, errCrash) {
				t.Fatalf("got %v, want the simulated crash", err)
			}
			if got, _ := os.ReadFile(stack); string(got) != "\x7fELF stack v1" {
				t.Errorf("stack binary after the crash: got %q, want the new one", got)
			}
			want := "absent"
			if replacing {
				want = `"old" -rwxr-xr-x`
			}
			if got := binaryState(t, bin); got != want {
				t.Errorf("plugin binary after the crash: got %s, want %s", got, want)
			}
			mustUninstall(t, n.opts(Standalone))
			sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
		})
	}
}

// TestStackUninstallKeepsRecordOnError: the stack binary's copy is gone;
// the error says which binary, the record stays, and a second try with
// the copy back finishes.
func TestStackUninstallKeepsRecordOnError(t *testing.T) {
	n := newNode(t)
	os.WriteFile(filepath.Join(n.binDir, "cni-usernet"), []byte("old"), 0o755)
	os.WriteFile(filepath.Join(n.binDir, "cni-usernet-stack"), []byte("old stack"), 0o755)
	before := snapshot(t, n.binDir)
	o := n.stackOpts(Standalone)
	if _, err := InstallBinary(o); err != nil {
		t.Fatal(err)
	}
	backup := backupPath(n.record, StackName("cni-usernet"))
	saved, _ := os.ReadFile(backup)
	os.Remove(backup)
	err := Uninstall(o)
	if err == nil || !strings.Contains(err.Error(), "stack binary") || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("got %v, want an error about the stack binary's missing copy", err)
	}
	if _, err := os.Stat(n.record); err != nil {
		t.Fatalf("record removed after a failed uninstall: %v", err)
	}
	os.WriteFile(backup, saved, 0o600)
	mustUninstall(t, o)
	sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), before)
}

// chainCase is a node's configuration before cni-usernet is chained in.
type chainCase struct {
	name  string
	files []string
	first string // the file being chained into
	want  string // the file containerd uses afterwards
	types []string
}

var chainCases = []chainCase{
	{"calico with portmap and bandwidth", []string{"10-calico.conflist", "99-loopback.conf"}, "10-calico.conflist", "10-calico.conflist",
		[]string{"calico", "portmap", "bandwidth", "cni-usernet"}},
	{"flannel conflist", []string{"10-flannel.conflist", "87-podman-bridge.conflist"}, "10-flannel.conflist", "10-flannel.conflist",
		[]string{"flannel", "portmap", "cni-usernet"}},
	{"cilium", []string{"05-cilium.conflist", "10-calico.conflist"}, "05-cilium.conflist", "05-cilium.conflist",
		[]string{"cilium-cni", "cni-usernet"}},
	{"flannel single-plugin conf", []string{"10-flannel.conf", "99-loopback.conf"}, "10-flannel.conf", "10-flannel.conflist",
		[]string{"flannel", "cni-usernet"}},
}

func TestChain(t *testing.T) {
	for _, tc := range chainCases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.put(tc.files...)
			// Unusual mode and owner, which the edit must keep.
			firstPath := filepath.Join(n.confDir, tc.first)
			if err := os.Chmod(firstPath, 0o600); err != nil {
				t.Fatal(err)
			}
			if os.Geteuid() == 0 {
				if err := os.Chown(firstPath, 1234, 5678); err != nil {
					t.Fatal(err)
				}
			}
			before := snapshot(t, n.confDir)
			orig := testdata(t, tc.first)
			o := n.opts(Chain)

			name, changed := mustInstall(t, o)
			if name != tc.want || !changed {
				t.Fatalf("got %s changed=%v, want %s changed", name, changed, tc.want)
			}
			if n.first() != tc.want {
				t.Errorf("containerd would use %s, want %s", n.first(), tc.want)
			}
			got := n.read(name)
			if types := pluginTypes(t, got); !slices.Equal(types, tc.types) {
				t.Errorf("plugins: got %v, want %v", types, tc.types)
			}
			var gotHead, origHead struct {
				Name       string `json:"name"`
				CNIVersion string `json:"cniVersion"`
			}
			json.Unmarshal(got, &gotHead)
			json.Unmarshal(orig, &origHead)
			if gotHead != origHead {
				t.Errorf("list name/version: got %+v, want %+v", gotHead, origHead)
			}
			if strings.HasSuffix(tc.first, ".conflist") {
				if k, want := keys(t, got), keys(t, orig); !slices.Equal(k, want) {
					t.Errorf("top-level keys: got %v, want the original order %v", k, want)
				}
			}
			// Everything of the original plugins is still there.
			l, _ := libcni.ConfListFromBytes(got)
			if !strings.HasSuffix(tc.first, ".conflist") {
				if !sameJSON(l.Plugins[0].Bytes, orig) {
					t.Errorf("converted plugin: got %s, want the .conf's object %s", l.Plugins[0].Bytes, orig)
				}
			} else {
				ol, _ := libcni.ConfListFromBytes(orig)
				for i, p := range ol.Plugins {
					if !sameJSON(l.Plugins[i].Bytes, p.Bytes) {
						t.Errorf("plugin %d: got %s, want %s", i, l.Plugins[i].Bytes, p.Bytes)
					}
				}
			}
			if !sameJSON(l.Plugins[len(l.Plugins)-1].Bytes, o.Plugin) {
				t.Errorf("our entry: got %s, want %s", l.Plugins[len(l.Plugins)-1].Bytes, o.Plugin)
			}
			// As the runtime reads it: it passes an argument only for a
			// capability the entry declares.
			for _, c := range []string{"io.kubernetes.cri.pod-annotations", "cgroupPath"} {
				if !l.Plugins[len(l.Plugins)-1].Network.Capabilities[c] {
					t.Errorf("our entry: capability %q not declared as the runtime reads it", c)
				}
			}
			after := snapshot(t, n.confDir)
			if w, g := before[tc.first], after[name]; g.mode != w.mode || g.uid != w.uid || g.gid != w.gid {
				t.Errorf("mode/owner: got %v %d:%d, want %v %d:%d", g.mode, g.uid, g.gid, w.mode, w.uid, w.gid)
			}
			noTemps(t, n.confDir)

			// Idempotent.
			s := stampOf(t, filepath.Join(n.confDir, name))
			rs := stampOf(t, n.record)
			time.Sleep(10 * time.Millisecond)
			if name2, changed := mustInstall(t, o); changed || name2 != name {
				t.Errorf("second run: got %s changed=%v, want %s unchanged", name2, changed, name)
			}
			if stampOf(t, filepath.Join(n.confDir, name)) != s || stampOf(t, n.record) != rs {
				t.Errorf("second run rewrote the configuration or the record")
			}

			mustUninstall(t, o)
			sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
		})
	}
}

// TestChainUpdatesOurEntry: a changed plugin object replaces ours in
// place, once.
func TestChainUpdatesOurEntry(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	before := snapshot(t, n.confDir)
	o := n.opts(Chain)
	mustInstall(t, o)
	o.Plugin = []byte(`{"type":"cni-usernet","gso":"software"}`)
	if _, changed := mustInstall(t, o); !changed {
		t.Fatal("new plugin object: no change")
	}
	l, _ := libcni.ConfListFromBytes(n.read("10-calico.conflist"))
	if got := pluginTypes(t, n.read("10-calico.conflist")); !slices.Equal(got, []string{"calico", "portmap", "bandwidth", "cni-usernet"}) {
		t.Errorf("plugins: got %v", got)
	}
	if !sameJSON(l.Plugins[3].Bytes, o.Plugin) {
		t.Errorf("our entry: got %s, want %s", l.Plugins[3].Bytes, o.Plugin)
	}
	if _, changed := mustInstall(t, o); changed {
		t.Error("same plugin object again: changed")
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

// calicoRewrite is what Calico's installer writes when it renders its
// template again (here with a different MTU), without our entry.
func calicoRewrite(t *testing.T) []byte {
	return bytes.Replace(testdata(t, "10-calico.conflist"), []byte(`"mtu": 0`), []byte(`"mtu": 1440`), 1)
}

// TestChainAfterExternalRewrite: Calico rewrites its conflist after we
// edited it; the next install puts us back, and uninstall then restores
// Calico's new file, not the old one.
func TestChainAfterExternalRewrite(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	o := n.opts(Chain)
	mustInstall(t, o)
	rewrite := calicoRewrite(t)
	n.write("10-calico.conflist", rewrite, 0o644)

	if _, changed := mustInstall(t, o); !changed {
		t.Fatal("after Calico's rewrite: no change, want us re-inserted")
	}
	if got := pluginTypes(t, n.read("10-calico.conflist")); !slices.Equal(got, []string{"calico", "portmap", "bandwidth", "cni-usernet"}) {
		t.Errorf("plugins: got %v", got)
	}
	mustUninstall(t, o)
	if got := n.read("10-calico.conflist"); !bytes.Equal(got, rewrite) {
		t.Errorf("after uninstall: got\n%s\nwant Calico's rewrite\n%s", got, rewrite)
	}
}

// TestUninstallAfterExternalRewrite: the file changed after our last
// write and we did not run again. Uninstall does not put old bytes back
// over someone's change: it only takes our entry out, if there is one.
func TestUninstallAfterExternalRewrite(t *testing.T) {
	t.Run("rewritten without us", func(t *testing.T) {
		n := newNode(t)
		n.put("10-calico.conflist")
		o := n.opts(Chain)
		mustInstall(t, o)
		rewrite := calicoRewrite(t)
		n.write("10-calico.conflist", rewrite, 0o644)
		mustUninstall(t, o)
		if got := n.read("10-calico.conflist"); !bytes.Equal(got, rewrite) {
			t.Errorf("got\n%s\nwant the rewrite untouched", got)
		}
	})
	t.Run("edited with our entry kept", func(t *testing.T) {
		n := newNode(t)
		n.put("10-calico.conflist")
		o := n.opts(Chain)
		mustInstall(t, o)
		edited := bytes.Replace(n.read("10-calico.conflist"), []byte(`"mtu": 0`), []byte(`"mtu": 1440`), 1)
		if bytes.Equal(edited, n.read("10-calico.conflist")) {
			t.Fatal("test edit did not apply")
		}
		n.write("10-calico.conflist", edited, 0o640)
		mustUninstall(t, o)
		got := n.read("10-calico.conflist")
		if types := pluginTypes(t, got); !slices.Equal(types, []string{"calico", "portmap", "bandwidth"}) {
			t.Errorf("plugins: got %v, want ours removed and the rest kept", types)
		}
		if !sameJSON(got, calicoRewrite(t)) {
			t.Errorf("got\n%s\nwant the edit kept with our entry removed", got)
		}
		if fi, _ := os.Stat(filepath.Join(n.confDir, "10-calico.conflist")); fi.Mode() != 0o640 {
			t.Errorf("mode: got %v, want the edited file's 0640", fi.Mode())
		}
	})
	t.Run("converted conf comes back, no run since", func(t *testing.T) {
		n := newNode(t)
		n.put("10-flannel.conf")
		o := n.opts(Chain)
		mustInstall(t, o)
		newConf := bytes.Replace(testdata(t, "10-flannel.conf"), []byte(`"hairpinMode": true`), []byte(`"hairpinMode": false`), 1)
		n.write("10-flannel.conf", newConf, 0o640)
		var logs bytes.Buffer
		o.Log = slog.New(slog.NewTextHandler(&logs, nil))
		mustUninstall(t, o)
		want := map[string]fileState{"10-flannel.conf": {data: string(newConf), mode: 0o640, uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}}
		sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), want)
		if strings.Contains(logs.String(), "WARN") {
			t.Errorf("warnings for an ordinary case:\n%s", logs.String())
		}
	})
	t.Run("converted conf comes back", func(t *testing.T) {
		// flannel's init container writes its .conf again on restart.
		n := newNode(t)
		n.put("10-flannel.conf")
		o := n.opts(Chain)
		mustInstall(t, o)
		newConf := bytes.Replace(testdata(t, "10-flannel.conf"), []byte(`"hairpinMode": true`), []byte(`"hairpinMode": false`), 1)
		n.write("10-flannel.conf", newConf, 0o644)
		if n.first() != "10-flannel.conf" {
			t.Fatalf("first: %s", n.first())
		}
		name, changed := mustInstall(t, o)
		if name != "10-flannel.conflist" || !changed || n.first() != "10-flannel.conflist" {
			t.Fatalf("reconvert: got %s changed=%v first=%s", name, changed, n.first())
		}
		if l, _ := libcni.ConfListFromBytes(n.read(name)); !sameJSON(l.Plugins[0].Bytes, newConf) {
			t.Errorf("converted plugin: got %s, want the new .conf", l.Plugins[0].Bytes)
		}
		mustUninstall(t, o)
		want := map[string]fileState{"10-flannel.conf": {data: string(newConf), mode: 0o644, uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}}
		sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), want)
	})
}

func TestChainRefused(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(n *node)
		plugin string
		want   string
		is     error
	}{
		{"empty directory", func(*node) {}, "", "nothing to chain to yet", ErrNothingToChain},
		{"no directory", func(n *node) { os.Remove(n.confDir) }, "", "nothing to chain to yet", ErrNothingToChain},
		{"only other extensions", func(n *node) {
			n.write("calico-kubeconfig", []byte("apiVersion: v1"), 0o600)
			n.write("10-calico.conflist.bak", testdata(n.t, "10-calico.conflist"), 0o644)
		}, "", "nothing to chain to yet", ErrNothingToChain},
		{"our own standalone first", func(n *node) {
			n.write("05-cni-usernet.conflist", testdata(n.t, "standalone.conflist"), 0o644)
			n.put("10-calico.conflist")
		}, "", "first configuration is cni-usernet's own", ErrOwnConfig},
		{"broken first file", func(n *node) {
			n.write("10-calico.conflist", []byte(`{"name": "k8s-pod-network", "plugins": [`), 0o644)
		}, "", "runtimes cannot load either", nil},
		{"version we do not speak", func(n *node) {
			n.write("10-old.conf", []byte(`{"cniVersion":"0.2.0","name":"old","type":"bridge"}`), 0o644)
		}, "", `cniVersion "0.2.0"`, nil},
		{"list in a .conf", func(n *node) {
			n.write("10-calico.conf", testdata(n.t, "10-calico.conflist"), 0o644)
		}, "", "missing 'type'", nil},
		{"symlink", func(n *node) {
			real := filepath.Join(n.t.TempDir(), "10-calico.conflist")
			os.WriteFile(real, testdata(n.t, "10-calico.conflist"), 0o644)
			os.Symlink(real, filepath.Join(n.confDir, "10-calico.conflist"))
		}, "", "symbolic link", nil},
		{"conversion would not sort first", func(n *node) {
			n.put("10-flannel.conf")
			n.write("10-flannel.confl.json", testdata(n.t, "99-loopback.conf"), 0o644)
		}, "", "would sort before", nil},
		{"plugin of another type", func(n *node) { n.put("10-calico.conflist") }, `{"type":"bridge"}`, `type "bridge", want "cni-usernet"`, nil},
		{"plugin not an object", func(n *node) { n.put("10-calico.conflist") }, `["cni-usernet"]`, "not a JSON object", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			tt.setup(n)
			var before map[string]fileState
			if _, err := os.Stat(n.confDir); err == nil {
				before = snapshot(t, n.confDir)
			}
			o := n.opts(Chain)
			if tt.plugin != "" {
				o.Plugin = []byte(tt.plugin)
			}
			_, _, err := InstallConfig(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("got %v, want errors.Is %v", err, tt.is)
			}
			if before != nil {
				sameSnapshot(t, "after refusal", snapshot(t, n.confDir), before)
			}
			if _, err := os.Stat(n.record); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused install wrote a record (err %v)", err)
			}
		})
	}
}

// TestModeChangeRefused: switching modes with configuration installed
// would leave a chained entry behind a standalone file, or the reverse.
func TestModeChangeRefused(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	mustInstall(t, n.opts(Standalone))
	_, _, err := InstallConfig(n.opts(Chain))
	if !errors.Is(err, ErrModeChange) {
		t.Fatalf("chain after standalone: got %v, want ErrModeChange", err)
	}
	mustUninstall(t, n.opts(Chain))
	if name, _ := mustInstall(t, n.opts(Chain)); name != "10-calico.conflist" {
		t.Errorf("chain after uninstall: got %s", name)
	}
}

var errCrash = errors.New("simulated crash")

// TestCrashAfterRecord: the record is written, the change it describes is
// not (the process died in between). Uninstall must still leave the node
// exactly as it was, and a new install must still work.
func TestCrashAfterRecord(t *testing.T) {
	type install func(n *node) error
	config := func(mode Mode) install {
		return func(n *node) error { _, _, err := InstallConfig(n.opts(mode)); return err }
	}
	binary := func(n *node) error { _, err := InstallBinary(n.opts(Standalone)); return err }
	withStack := func(n *node) error { _, err := InstallBinary(n.stackOpts(Standalone)); return err }
	tests := []struct {
		name  string
		setup func(n *node)
		// done happens fully before the crash.
		done   []install
		crash  install
		verify func(t *testing.T, n *node)
	}{
		{"standalone, first write", func(n *node) { n.put("10-calico.conflist") }, nil, config(Standalone), nil},
		{"chain into a conflist", func(n *node) { n.put("10-calico.conflist") }, nil, config(Chain), nil},
		{"chain converting a conf", func(n *node) { n.put("10-flannel.conf", "99-loopback.conf") }, nil, config(Chain), nil},
		{"chain again after Calico's rewrite", func(n *node) { n.put("10-calico.conflist") }, []install{config(Chain), func(n *node) error {
			n.write("10-calico.conflist", calicoRewrite(n.t), 0o644)
			return nil
		}}, config(Chain), func(t *testing.T, n *node) {
			if got := n.read("10-calico.conflist"); !bytes.Equal(got, calicoRewrite(t)) {
				t.Errorf("got\n%s\nwant Calico's rewrite", got)
			}
		}},
		{"binary, first install", func(*node) {}, nil, binary, nil},
		{"binary replacing one", func(n *node) {
			os.WriteFile(filepath.Join(n.binDir, "cni-usernet"), []byte("old"), 0o755)
		}, nil, binary, nil},
		// The stack's binary is the first change InstallBinary makes.
		{"stack and binary, first install", func(*node) {}, nil, withStack, nil},
		{"stack and binary replacing both", func(n *node) {
			os.WriteFile(filepath.Join(n.binDir, "cni-usernet"), []byte("old"), 0o755)
			os.WriteFile(filepath.Join(n.binDir, "cni-usernet-stack"), []byte("old stack"), 0o750)
		}, nil, withStack, nil},
		{"stack added to an installed binary", func(*node) {}, []install{binary}, withStack, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			tt.setup(n)
			confBefore, binBefore := snapshot(t, n.confDir), snapshot(t, n.binDir)
			for _, d := range tt.done {
				if err := d(n); err != nil {
					t.Fatal(err)
				}
			}
			stateBefore := snapshot(t, n.confDir)
			crashAfterRecord = func() error { return errCrash }
			err := tt.crash(n)
			crashAfterRecord = nil
			if !errors.Is(err, errCrash) {
				t.Fatalf("got %v, want the simulated crash", err)
			}
			if _, err := os.Stat(n.record); err != nil {
				t.Fatalf("no record after the crash: %v", err)
			}
			sameSnapshot(t, "after the crash", snapshot(t, n.confDir), stateBefore)

			mustUninstall(t, n.opts(Standalone))
			if tt.verify != nil {
				tt.verify(t, n)
			} else {
				sameSnapshot(t, "conf dir after uninstall", snapshot(t, n.confDir), confBefore)
			}
			sameSnapshot(t, "bin dir after uninstall", snapshot(t, n.binDir), binBefore)
		})
	}
}

// TestCrashThenInstall: after a crash between record and change, the next
// install completes, and uninstall still restores the original.
func TestCrashThenInstall(t *testing.T) {
	n := newNode(t)
	n.put("10-flannel.conf")
	before := snapshot(t, n.confDir)
	o := n.opts(Chain)
	crashAfterRecord = func() error { return errCrash }
	_, _, err := InstallConfig(o)
	crashAfterRecord = nil
	if !errors.Is(err, errCrash) {
		t.Fatalf("got %v, want the simulated crash", err)
	}
	if name, changed := mustInstall(t, o); name != "10-flannel.conflist" || !changed {
		t.Fatalf("install after crash: got %s changed=%v", name, changed)
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

// TestUninstallWithAnotherView: the agent installed through its
// container's mount; uninstall runs on the host with other paths to the
// same directories.
func TestUninstallWithAnotherView(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	before := snapshot(t, n.confDir)
	view := t.TempDir()
	hostConf, hostBin := n.confDir, n.binDir
	for name, dir := range map[string]string{"net.d": n.confDir, "bin": n.binDir} {
		if err := os.Symlink(dir, filepath.Join(view, name)); err != nil {
			t.Fatal(err)
		}
	}
	o := n.opts(Chain)
	o.ConfDir, o.BinDir = filepath.Join(view, "net.d"), filepath.Join(view, "bin")
	if _, err := InstallBinary(o); err != nil {
		t.Fatal(err)
	}
	mustInstall(t, o)
	os.Remove(filepath.Join(view, "net.d"))
	os.Remove(filepath.Join(view, "bin"))

	o.ConfDir, o.BinDir = hostConf, hostBin
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
	if _, err := os.Stat(filepath.Join(hostBin, "cni-usernet")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("binary still there (err %v)", err)
	}
}

// TestUninstallKeepsRecordOnError: a failed restore keeps the record so
// that a second try finishes the job.
func TestUninstallKeepsRecordOnError(t *testing.T) {
	n := newNode(t)
	os.WriteFile(filepath.Join(n.binDir, "cni-usernet"), []byte("old"), 0o755)
	o := n.opts(Standalone)
	if _, err := InstallBinary(o); err != nil {
		t.Fatal(err)
	}
	backup := backupPath(n.record, "cni-usernet")
	saved, _ := os.ReadFile(backup)
	os.Remove(backup)
	if err := Uninstall(o); err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("got %v, want an error about the missing copy", err)
	}
	if _, err := os.Stat(n.record); err != nil {
		t.Fatalf("record removed after a failed uninstall: %v", err)
	}
	os.WriteFile(backup, saved, 0o600)
	mustUninstall(t, o)
	if got, _ := os.ReadFile(filepath.Join(n.binDir, "cni-usernet")); string(got) != "old" {
		t.Errorf("binary: got %q, want the old one back", got)
	}
}

func TestWriteAtomicRemovesTempOnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10-x.conflist")
	os.WriteFile(path, []byte("before"), 0o644)
	err := writeAtomic(path, failingReader{}, fileMeta{Mode: 0o644, UID: -1, GID: -1})
	if err == nil {
		t.Fatal("no error from a failing reader")
	}
	if got, _ := os.ReadFile(path); string(got) != "before" {
		t.Errorf("file changed by a failed write: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("got %d entries, want only the file: %v", len(entries), entries)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, fmt.Errorf("disk on fire") }

// TestTempNamesInvisible: the temporary names we write are never
// configuration files for libcni.
func TestTempNamesInvisible(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"05-cni-usernet.conflist", "10-flannel.conf", "x.json"} {
		f, err := os.CreateTemp(dir, atomicfile.TempPrefix(filepath.Join(dir, name))+"*")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if files, _ := confFiles(dir); len(files) != 0 {
		t.Errorf("libcni sees our temporary files: %v", files)
	}
}

func TestObjectKeepsOrder(t *testing.T) {
	in := []byte(`{"name":"n","cniVersion":"1.0.0","zeta":{"b":1,"a":2},"plugins":[{"type":"x"}],"alpha":true}`)
	c, err := parseConflist(in)
	if err != nil {
		t.Fatal(err)
	}
	c.chain("cni-usernet", []byte(`{"type":"cni-usernet"}`))
	out, err := c.marshal()
	if err != nil {
		t.Fatal(err)
	}
	if k := keys(t, out); !slices.Equal(k, []string{"name", "cniVersion", "zeta", "plugins", "alpha"}) {
		t.Errorf("keys: got %v", k)
	}
	if !bytes.Contains(out, []byte(`"b": 1,`)) || bytes.Index(out, []byte(`"b"`)) > bytes.Index(out, []byte(`"a"`)) {
		t.Errorf("nested order lost:\n%s", out)
	}
	for _, bad := range []string{`[]`, `{"a":1} {}`, `{"a":`, `"x"`} {
		if _, err := parseObject([]byte(bad)); err == nil {
			t.Errorf("parseObject(%s): no error", bad)
		}
	}
}

// TestChainRewrittenWithOurEntry: someone rewrote the file keeping our
// entry, then we changed our entry. The bytes we captured hold our old
// entry, so uninstall must not put them back: it takes our entry out.
func TestChainRewrittenWithOurEntry(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	o := n.opts(Chain)
	mustInstall(t, o)
	edited := bytes.Replace(n.read("10-calico.conflist"), []byte(`"mtu": 0`), []byte(`"mtu": 1440`), 1)
	n.write("10-calico.conflist", edited, 0o644)
	o.Plugin = []byte(`{"type":"cni-usernet","gso":"off"}`)
	if _, changed := mustInstall(t, o); !changed {
		t.Fatal("new plugin object: no change")
	}
	mustUninstall(t, o)
	got := n.read("10-calico.conflist")
	if types := pluginTypes(t, got); !slices.Equal(types, []string{"calico", "portmap", "bandwidth"}) {
		t.Errorf("plugins: got %v, want ours gone", types)
	}
	if !sameJSON(got, calicoRewrite(t)) {
		t.Errorf("got\n%s\nwant the rewrite without our entry", got)
	}
}

// TestChainFollowsTheFirstFile: another network plugin's file now sorts
// first; the next run chains into it too, and uninstall restores both.
func TestChainFollowsTheFirstFile(t *testing.T) {
	n := newNode(t)
	n.put("10-calico.conflist")
	o := n.opts(Chain)
	mustInstall(t, o)
	n.put("05-cilium.conflist")
	before := map[string]fileState{}
	for name, s := range snapshot(t, n.confDir) {
		before[name] = s
	}
	before["10-calico.conflist"] = fileState{data: string(testdata(t, "10-calico.conflist")), mode: 0o644, uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}

	name, changed := mustInstall(t, o)
	if name != "05-cilium.conflist" || !changed {
		t.Fatalf("got %s changed=%v, want 05-cilium.conflist changed", name, changed)
	}
	if got := pluginTypes(t, n.read(name)); !slices.Equal(got, []string{"cilium-cni", "cni-usernet"}) {
		t.Errorf("plugins: got %v", got)
	}
	mustUninstall(t, o)
	sameSnapshot(t, "after uninstall", snapshot(t, n.confDir), before)
}

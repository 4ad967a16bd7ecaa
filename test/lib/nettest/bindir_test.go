package nettest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// A new BinDir removes the directories of test binaries that are gone
// and keeps those of running ones and any it cannot attribute.
func TestNewBinDirSweepsDeadOnes(t *testing.T) {
	parent := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(name string) string {
		p := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(p, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := mk(binDirPrefix + strconv.Itoa(dead.Process.Pid) + "-123")
	live := mk(binDirPrefix + "1-456") // init
	unknown := mk(binDirPrefix + "789012")
	other := mk("something-else")
	dir, err := newBinDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{{gone, false}, {live, true}, {unknown, true}, {other, true}, {dir, true}} {
		_, err := os.Stat(c.path)
		if got := err == nil; got != c.want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(c.path), got, c.want)
		}
	}
	if want := binDirPrefix + strconv.Itoa(os.Getpid()) + "-"; filepath.Base(dir)[:len(want)] != want {
		t.Errorf("new directory %s does not name this process (%s…)", filepath.Base(dir), want)
	}
}

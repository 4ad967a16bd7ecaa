package attachment

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNames: the node-side veth name fits the kernel's 15 bytes and
// differs per interface of one container; the files of two attachments
// never collide, and each sits in the directory it is asked for.
func TestNames(t *testing.T) {
	a, b := HostVethName("0123456789abcdef0123456789abcdef", "eth0"), HostVethName("0123456789abcdef0123456789abcdef", "net1")
	if len(a) > 15 || !strings.HasPrefix(a, "usn") || a == b {
		t.Fatalf("veth names %q, %q", a, b)
	}
	p, q := PathsFor("/s", "/r", "/l", "c1", "eth0"), PathsFor("/s", "/r", "/l", "c2", "eth0")
	if p.Config == q.Config || p.Socket == q.Socket || p.Log == q.Log {
		t.Fatalf("two attachments share files: %+v %+v", p, q)
	}
	if filepath.Dir(p.Config) != p.StackDir || filepath.Dir(p.Spec) != p.StackDir || !strings.HasPrefix(p.StackDir, "/s/") ||
		filepath.Dir(p.Socket) != "/r" || filepath.Dir(p.Log) != "/l" {
		t.Fatalf("paths in the wrong places: %+v", p)
	}
}

// TestStackBinary: the plugin runs stacks from cni-usernet-stack beside
// it when that is an executable file, and anything else there, or
// nothing, is an error that names the missing file (the plugin's own
// binary has no stack to fall back on).
func TestStackBinary(t *testing.T) {
	for _, c := range []struct {
		name     string
		make     func(path string) error // nil: nothing at the stack's path
		useStack bool
	}{
		{"absent", nil, false},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o755) }, false},
		{"not executable", func(p string) error { return os.WriteFile(p, []byte("stack"), 0o644) }, false},
		{"executable", func(p string) error { return os.WriteFile(p, []byte("stack"), 0o755) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			exe := filepath.Join(t.TempDir(), "cni-usernet")
			if err := os.WriteFile(exe, []byte("plugin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if c.make != nil {
				if err := c.make(exe + "-stack"); err != nil {
					t.Fatal(err)
				}
			}
			got, err := StackBinary(exe)
			switch {
			case c.useStack && (err != nil || got != exe+"-stack"):
				t.Errorf("StackBinary = %q, %v; want %s", got, err, exe+"-stack")
			case !c.useStack && (err == nil || !strings.Contains(err.Error(), "cni-usernet-stack")):
				t.Errorf("StackBinary = %q, %v; want an error naming cni-usernet-stack", got, err)
			}
			if c.useStack {
				if again, err := StackBinary(got); err != nil || again != got {
					t.Errorf("StackBinary of the stack's own path = %q, %v; want it unchanged", again, err)
				}
			}
		})
	}
}

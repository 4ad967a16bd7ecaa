package buildinfo

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBinariesPrintTheStamp builds the three binaries with the stamp the
// Makefile and the release scripts set, and each prints it for `version`
// and `--version`.
func TestBinariesPrintTheStamp(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..", "..")
	const stamp = "v0.0.0-stamped"
	bin := t.TempDir()
	for _, name := range []string{"cni-usernet", "cni-usernet-agent", "cni-usernet-stack"} {
		exe := filepath.Join(bin, name)
		build := exec.Command("go", "build", "-ldflags", "-X github.com/cni-usernet/cni-usernet/pkg/util/buildinfo.Version="+stamp,
			"-o", exe, "./cmd/"+name)
		build.Dir = repo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", name, err, out)
		}
		for _, arg := range []string{"version", "--version"} {
			out, err := exec.Command(exe, arg).CombinedOutput()
			if got, want := strings.TrimSpace(string(out)), name+" "+stamp; err != nil || got != want {
				t.Errorf("%s %s: got %q (%v), want %q", name, arg, got, err, want)
			}
		}
	}
}

func TestString(t *testing.T) {
	if got, want := String("cni-usernet-agent"), "cni-usernet-agent "+Version; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

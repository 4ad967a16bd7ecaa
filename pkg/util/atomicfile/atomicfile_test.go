package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteReplacesWithMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("got %q (%v), want %q", got, err, "new")
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode: got %v, want 0600", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("got %d entries, want only the file: %v", len(entries), entries)
	}
}

func TestWriteFromKeepsOwnerAndSetgid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file away")
	}
	path := filepath.Join(t.TempDir(), "f")
	meta := Meta{Mode: 0o750 | fs.ModeSetgid, UID: 4242, GID: 4343}
	if err := WriteFrom(path, strings.NewReader("x"), meta); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != meta.UID || int(st.Gid) != meta.GID {
		t.Errorf("owner: got %d:%d, want %d:%d", st.Uid, st.Gid, meta.UID, meta.GID)
	}
	if got := fi.Mode() & (fs.ModePerm | fs.ModeSetgid); got != meta.Mode {
		t.Errorf("mode: got %v, want %v", got, meta.Mode)
	}
}

func TestWriteFromFailureLeavesOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("before"), 0o644)
	if err := WriteFrom(path, errReader{errors.New("disk on fire")}, Meta{Mode: 0o644, UID: -1, GID: -1}); err == nil {
		t.Fatal("no error from a failing reader")
	}
	if got, _ := os.ReadFile(path); string(got) != "before" {
		t.Errorf("file changed by a failed write: %q", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("got %d entries, want only the file: %v", len(entries), entries)
	}
}

func TestRemoveAlreadyGone(t *testing.T) {
	if err := Remove(filepath.Join(t.TempDir(), "never")); err != nil {
		t.Errorf("removing a missing file: %v", err)
	}
}

// errReader fails every read.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// SPDX-License-Identifier: Apache-2.0

package logfile_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/stack/logfile"
)

// open opens the log and its rotated file as the launcher does.
func open(t *testing.T, dir string) (log, rotated *os.File) {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(dir, "x.log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	rotated, err = os.OpenFile(filepath.Join(dir, "x.log.1"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close(); rotated.Close() })
	return log, rotated
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCapAndRotation: however much is written, each file stays within
// the cap, the newest lines are in the log, the ones before them in the
// rotated file, and no line is split between the two.
func TestCapAndRotation(t *testing.T) {
	dir := t.TempDir()
	log, rotated := open(t, dir)
	const capBytes = 1000
	w, err := logfile.New(log, rotated, capBytes)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10000
	for i := range n {
		line := fmt.Sprintf("line %05d %s\n", i, strings.Repeat("x", i%40))
		if k, err := w.Write([]byte(line)); err != nil || k != len(line) {
			t.Fatalf("write %d: got %d, %v; want %d, nil", i, k, err, len(line))
		}
		for _, name := range []string{"x.log", "x.log.1"} {
			if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() > capBytes {
				t.Fatalf("after line %d, %s: %v, size over the cap %d", i, name, err, capBytes)
			}
		}
	}
	cur, old := read(t, filepath.Join(dir, "x.log")), read(t, filepath.Join(dir, "x.log.1"))
	if !strings.HasPrefix(cur, "line ") || !strings.HasSuffix(cur, "\n") || !strings.HasPrefix(old, "line ") || !strings.HasSuffix(old, "\n") {
		t.Fatalf("a line split by rotation:\nrotated ends %q\nlog begins %q", old[max(0, len(old)-40):], cur[:min(40, len(cur))])
	}
	lines := strings.Split(strings.TrimSuffix(old+cur, "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, fmt.Sprintf("line %05d ", n-1)) {
		t.Fatalf("last line: got %q, want line %d", last, n-1)
	}
	for i := 1; i < len(lines); i++ {
		var a, b int
		fmt.Sscanf(lines[i-1], "line %d", &a)
		fmt.Sscanf(lines[i], "line %d", &b)
		if b != a+1 {
			t.Fatalf("lines %d then %d: a gap inside what the two files keep", a, b)
		}
	}
	if w.Dropped() != 0 {
		t.Errorf("dropped: got %d, want 0", w.Dropped())
	}
}

// TestRotatedAtStart: a log left over the cap by the process before (a
// crash's report written straight to stderr) is rotated when the next
// one starts, keeping its end.
func TestRotatedAtStart(t *testing.T) {
	dir := t.TempDir()
	log, rotated := open(t, dir)
	const capBytes = 100
	big := strings.Repeat("goroutine\n", 50) + "panic: the end\n"
	if _, err := log.WriteString(big); err != nil {
		t.Fatal(err)
	}
	w, err := logfile.New(log, rotated, capBytes)
	if err != nil {
		t.Fatal(err)
	}
	if cur := read(t, filepath.Join(dir, "x.log")); cur != "" {
		t.Fatalf("log after start: got %d bytes, want 0", len(cur))
	}
	old := read(t, filepath.Join(dir, "x.log.1"))
	if len(old) != capBytes || !strings.HasSuffix(old, "panic: the end\n") {
		t.Fatalf("rotated: got %d bytes ending %q, want %d ending with the panic", len(old), old[max(0, len(old)-20):], capBytes)
	}
	w.Write([]byte("next\n"))
	if cur := read(t, filepath.Join(dir, "x.log")); cur != "next\n" {
		t.Fatalf("log: got %q, want the new line", cur)
	}
}

// TestLongLineAndNoRoom: a line longer than the cap is cut to it; with
// no rotated file, the full log is emptied rather than grown.
func TestLongLineAndNoRoom(t *testing.T) {
	dir := t.TempDir()
	log, rotated := open(t, dir)
	rotated.Close() // rotation fails: the log is emptied instead
	w, err := logfile.New(log, rotated, 100)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(bytes.Repeat([]byte("y"), 250))
	if cur := read(t, filepath.Join(dir, "x.log")); len(cur) != 100 || w.Dropped() != 150 {
		t.Fatalf("long line: got %d bytes, %d dropped; want 100 and 150", len(cur), w.Dropped())
	}
	w.Write([]byte("after\n"))
	if cur := read(t, filepath.Join(dir, "x.log")); cur != "after\n" {
		t.Fatalf("log without a rotated file: got %q, want the last line only", cur)
	}
}

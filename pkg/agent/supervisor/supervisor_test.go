package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBackoffDoublesFromSecondCrashUpToMax(t *testing.T) {
	s := New(Config{Backoff: time.Second, MaxBackoff: 10 * time.Second})
	want := []time.Duration{0, 0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for crashes, w := range want {
		if got := s.backoff(crashes); got != w {
			t.Errorf("backoff(%d) = %s, want %s", crashes, got, w)
		}
	}
}

func TestLastLinePrefersThePanic(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct{ log, want string }{
		{"{\"msg\":\"serving\"}\npanic: runtime error: index out of range\n\ngoroutine 1 [running]:\nmain.main()\n", "panic: runtime error: index out of range"},
		{"fatal error: out of memory\nruntime stack:\n", "fatal error: out of memory"},
		{"{\"msg\":\"serving\"}\n{\"msg\":\"stopping\"}\n", "{\"msg\":\"stopping\"}"},
		{"", "exited without a message (killed?)"},
	}
	for i, c := range cases {
		if got := lastLine(write(strings.Repeat("x", i+1), c.log)); got != c.want {
			t.Errorf("lastLine(%q) = %q, want %q", c.log, got, c.want)
		}
	}
	if got := lastLine(filepath.Join(dir, "missing")); got != "exited (no log)" {
		t.Errorf("missing log: %q", got)
	}
}

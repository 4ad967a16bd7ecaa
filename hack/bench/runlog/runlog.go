// Package runlog is the benchmark's progress log: timestamped lines on
// stderr, with the tails of long command outputs.
package runlog

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Logf writes one timestamped line to stderr.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

// Tail is s trimmed to its last n bytes, marked with an ellipsis when cut.
func Tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

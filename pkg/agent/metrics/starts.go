package metrics

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// startsFile counts agent starts in the state directory, which outlives
// the agent's container.
const startsFile = "agent-starts"

// CountStart records one more agent start on this node and returns the
// count, this start included. An unreadable count starts again from 1
// (Prometheus takes a counter that went down for a reset).
func CountStart(stateDir string) (uint64, error) {
	path := filepath.Join(stateDir, startsFile)
	var n uint64
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		n, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	case !errors.Is(err, os.ErrNotExist):
		return 1, fmt.Errorf("reading the agent start count: %w", err)
	}
	n++
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return n, fmt.Errorf("recording an agent start: %w", err)
	}
	if err := atomicfile.Write(path, []byte(strconv.FormatUint(n, 10)+"\n"), 0o600); err != nil {
		return n, fmt.Errorf("recording an agent start: %w", err)
	}
	return n, nil
}

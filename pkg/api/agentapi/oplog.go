package agentapi

// The operation log carries the plugin's verbs to the node agent: each
// ADD, DEL and CHECK appends one short line (verb, result, duration) to a
// file in the state directory, and the agent drains the file into its
// latency histograms. The plugin is short-lived and must not wait for
// anyone, so it only appends (one open, lock, write, close: little beside
// the ADD it records); the file is bounded, and emptied by every drain.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// FileName is the log's name in the state directory.
const FileName = "plugin-ops.log"

// MaxSize bounds the file while no agent drains it (about 30,000
// records); beyond it records are dropped, never ADD delayed.
const MaxSize = 1 << 20

// ErrFull is returned by Append when the file has reached MaxSize.
var ErrFull = errors.New("plugin operation log full (no agent draining it)")

// Results a record carries.
const (
	ResultSuccess       = "success"
	ResultError         = "error"
	ResultTryAgainLater = "try_again_later"
)

// Record is one verb the plugin ran.
type Record struct {
	Verb     string // ADD, DEL, CHECK
	Result   string // one of the Result constants
	Duration time.Duration
}

// Append adds r to the log in dir. The state directory is the plugin's
// own, so a missing directory (nothing attached yet, a failed ADD) means
// there is nobody to tell.
func Append(dir string, r Record) error {
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening plugin operation log: %w", err)
	}
	defer f.Close()
	// The lock keeps a record whole against the agent's drain, which
	// reads and truncates under it.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking plugin operation log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading plugin operation log's size: %w", err)
	}
	if st.Size() >= MaxSize {
		return ErrFull
	}
	line := fmt.Sprintf("%s %s %.6f\n", r.Verb, r.Result, r.Duration.Seconds())
	if _, err := f.WriteString(line); err != nil {
		return fmt.Errorf("appending to plugin operation log: %w", err)
	}
	return nil
}

// Drain returns every record in dir's log and empties it. Malformed lines
// (a torn write after a crash) are counted in bad and skipped.
func Drain(dir string) (recs []Record, bad int, err error) {
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("opening plugin operation log: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return nil, 0, fmt.Errorf("locking plugin operation log: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 2*MaxSize))
	if err != nil {
		return nil, 0, fmt.Errorf("reading plugin operation log: %w", err)
	}
	if len(b) == 0 {
		return nil, 0, nil
	}
	if err := f.Truncate(0); err != nil {
		return nil, 0, fmt.Errorf("emptying plugin operation log: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		r, ok := parse(sc.Text())
		if !ok {
			bad++
			continue
		}
		recs = append(recs, r)
	}
	return recs, bad, nil
}

func parse(line string) (Record, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return Record{}, false
	}
	switch f[0] {
	case "ADD", "DEL", "CHECK":
	default:
		return Record{}, false
	}
	switch f[1] {
	case ResultSuccess, ResultError, ResultTryAgainLater:
	default:
		return Record{}, false
	}
	s, err := strconv.ParseFloat(f[2], 64)
	if err != nil || s < 0 {
		return Record{}, false
	}
	return Record{Verb: f[0], Result: f[1], Duration: time.Duration(s * float64(time.Second))}, true
}

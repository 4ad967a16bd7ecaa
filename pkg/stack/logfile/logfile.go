// SPDX-License-Identifier: Apache-2.0

// Package logfile caps the stack's log file and rotates it, as kubelet
// does a container's log: the file the stack writes, and one rotated out
// beside it, each at most MaxBytes. The serving stack may open no file
// (its seccomp filter), so both are descriptors the launcher opened:
// rotation copies the log into the rotated file and truncates the log,
// as logrotate's copytruncate does. A package of its own, apart from
// the stack's command that uses it, so that its tests drive it on plain
// files without a stack.
package logfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// MaxBytes is the cap of each of the log's files, kubelet's default
// containerLogMaxSize. A line never lands in a file it would take past
// the cap, unless the file is empty.
const MaxBytes = 10 << 20

// Files is how many files a stack's log takes at most, the one written
// and the rotated one, counted as kubelet's containerLogMaxFiles counts:
// so a stack's log holds at most Files*MaxBytes on the node.
const Files = 2

// Writer writes a log file through the cap. Safe for concurrent use.
type Writer struct {
	mu sync.Mutex // guards everything below
	// log is the file written, opened for reading and appending (every
	// write lands at its end, whoever else writes it: the Go runtime's
	// crash report goes there through the same descriptor); rotated
	// receives the log when it is full, opened for appending.
	log, rotated *os.File
	max          int64
	size         int64 // of log, as this Writer wrote it
	// dropped counts the bytes refused because neither rotation nor
	// truncation could make room: the cap holds even then.
	dropped int64
	buf     []byte // the copy's, allocated at the first rotation
}

// New writes log through the cap of max bytes a file, rotating it into
// rotated. A log already at the cap (a crash's report, the lines of the
// stack that ran before) is rotated now.
func New(log, rotated *os.File, max int64) (*Writer, error) {
	if max <= 0 {
		return nil, fmt.Errorf("log cap %d: must be positive", max)
	}
	st, err := log.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the log's size: %w", err)
	}
	w := &Writer{log: log, rotated: rotated, max: max, size: st.Size()}
	if w.size >= max {
		if err := w.rotate(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Write appends p to the log, rotating it first when p would take it
// past the cap. It never fails for lack of room: a line it cannot place
// is dropped and counted (Dropped), so that a logger goes on.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.size > 0 && w.size+int64(len(p)) > w.max {
		if err := w.rotate(); err != nil {
			// Without room, the lines of the full log are worth more
			// than the line that would take it past the cap.
			if w.log.Truncate(0) != nil {
				w.dropped += int64(len(p))
				return len(p), nil
			}
			w.size = 0
		}
	}
	if int64(len(p)) > w.max {
		// A line longer than a whole file is cut to fit.
		w.dropped += int64(len(p)) - w.max
		n, err := w.log.Write(p[:w.max])
		w.size += int64(n)
		if err != nil {
			return n, err
		}
		return len(p), nil
	}
	n, err := w.log.Write(p)
	w.size += int64(n)
	return n, err
}

// Dropped is how many bytes the cap refused.
func (w *Writer) Dropped() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// rotate replaces the rotated file's content with the log's and empties
// the log. Called with mu held, or before w is shared.
func (w *Writer) rotate() error {
	if w.rotated == nil {
		return errors.New("no rotated file")
	}
	if err := w.rotated.Truncate(0); err != nil {
		return fmt.Errorf("emptying the rotated log: %w", err)
	}
	if w.buf == nil {
		w.buf = make([]byte, 64<<10)
	}
	// The log's whole content, up to the cap: what a crash appended
	// beyond it is its end, which says why.
	var off int64
	end := w.size
	if end > w.max {
		off = end - w.max
	}
	for off < end {
		n, err := w.log.ReadAt(w.buf[:min(int64(len(w.buf)), end-off)], off)
		if n > 0 {
			if _, werr := w.rotated.Write(w.buf[:n]); werr != nil {
				return fmt.Errorf("copying the log into the rotated one: %w", werr)
			}
			off += int64(n)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("reading the log to rotate it: %w", err)
		}
	}
	if err := w.log.Truncate(0); err != nil {
		return fmt.Errorf("emptying the log: %w", err)
	}
	w.size = 0
	return nil
}

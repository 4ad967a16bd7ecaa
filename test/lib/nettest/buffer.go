package nettest

import (
	"bytes"
	"sync"
)

// LockedBuffer collects output written from several goroutines (a
// process's stdout and stderr, a logger) and reads it while they write.
type LockedBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

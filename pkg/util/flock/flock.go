// Package flock takes an exclusive lock on a file, for the node's
// processes that serialise on one: installers sharing a record, ADDs
// loading the node's socket redirect. A package of its own so that both
// lock the same way; the lock file stays when released, since removing it
// would let a waiter lock an unlinked file.
package flock

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive lock on path, creating it and its directory,
// and waits for it; unlock releases it.
func Lock(path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating directory of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

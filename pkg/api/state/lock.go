package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Lock serialises everything that changes one attachment: the plugin's
// ADD, DEL and CHECK, and the node agent restarting or reclaiming its
// stack. Without it a DEL could remove the state while the agent restarts
// the stack, leaving a stack nobody knows about; two ADDs for the same
// attachment could both build one.
type Lock struct {
	f     *os.File
	path  string
	state string // the attachment's state file
}

// lockPoll is how often a waiting Lock retries: flock has no timeout.
const lockPoll = 20 * time.Millisecond

// Lock takes the attachment's lock, waiting up to timeout for another
// holder to finish.
func (s Store) Lock(containerID, ifName string, timeout time.Duration) (*Lock, error) {
	return s.LockKey(Key(containerID, ifName), timeout)
}

// LockKey is Lock for an attachment known by its key.
func (s Store) LockKey(key string, timeout time.Duration) (*Lock, error) {
	dir := filepath.Join(s.Dir, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, key+".lock")
	deadline := time.Now().Add(timeout)
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening lock %s: %w", path, err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// The holder before us may have removed the file after we
			// opened it (Unlock with remove); a lock on an unlinked file
			// excludes nobody, so start again on the current file.
			if same(f, path) {
				return &Lock{f: f, path: path, state: filepath.Join(s.Dir, key+suffix)}, nil
			}
			f.Close()
			continue
		}
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("attachment %s is busy: another ADD, DEL or the node agent has held its lock for more than %s", key, timeout)
		}
		time.Sleep(lockPoll)
	}
}

func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// Unlock releases the lock. With remove, the lock file goes too (the
// attachment is gone for good), so that locks do not pile up on a node.
func (l *Lock) Unlock(remove bool) {
	if l == nil {
		return
	}
	if remove {
		os.Remove(l.path)
	}
	l.f.Close()
}

// Release releases the lock and removes its file when the attachment has
// no state (it was deleted, or never completed): lock files live exactly
// as long as their attachments.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	_, err := os.Stat(l.state)
	l.Unlock(errors.Is(err, os.ErrNotExist))
}

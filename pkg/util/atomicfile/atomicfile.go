// Package atomicfile replaces files so that a reader never sees a torn
// write and a crash never leaves a half-written file under the real name.
// It is a package of its own because every process writes files another
// reads (the plugin's records, the agent's policies and conflists) with the
// same care: one implementation, tested once.
package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Meta is what a written file gets besides its bytes.
type Meta struct {
	// Mode is the file's permission bits, with setuid, setgid and sticky
	// kept.
	Mode fs.FileMode
	// UID and GID name the file's owner; -1 leaves the one the process
	// gives it (as os.Chown does). The zero value means root.
	UID, GID int
}

// TempPrefix is how the temporary file for path starts: dot-prefixed and
// with an extension (".tmp…") that libcni.ConfFiles never matches, so
// neither containerd nor CRI-O load a half-written configuration, and a
// runtime never executes a half-copied binary (it only runs a plugin by
// its "type").
func TempPrefix(path string) string {
	return "." + filepath.Base(path) + ".tmp"
}

// Write replaces path with data, mode perm, owned by the process; see
// WriteFrom.
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteFrom(path, bytes.NewReader(data), Meta{Mode: perm, UID: -1, GID: -1})
}

// WriteVolatile is Write without the syncs, file and directory: for a
// file read only by processes of this boot, which the page cache serves,
// the rename still keeps readers from a torn write; a crash may lose it.
func WriteVolatile(path string, data []byte, perm fs.FileMode) error {
	return write(path, bytes.NewReader(data), Meta{Mode: perm, UID: -1, GID: -1}, false)
}

// WriteFrom replaces path with the bytes from r through a temporary file
// in the same directory: written, given meta's owner and mode, synced,
// renamed, and the directory synced so that the rename survives a crash.
// The temporary file is removed on any error.
func WriteFrom(path string, r io.Reader, meta Meta) error {
	return write(path, r, meta, true)
}

func write(path string, r io.Reader, meta Meta, durable bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, TempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", path, err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if meta.UID >= 0 || meta.GID >= 0 {
		if err := f.Chown(meta.UID, meta.GID); err != nil {
			return fmt.Errorf("setting owner of %s to %d:%d: %w", tmp, meta.UID, meta.GID, err)
		}
	}
	// After Chown, which clears setuid/setgid bits.
	if err := f.Chmod(meta.Mode); err != nil {
		return fmt.Errorf("setting mode of %s to %v: %w", tmp, meta.Mode, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, path, err)
	}
	done = true
	if !durable {
		return nil
	}
	return SyncDir(dir)
}

// Remove removes path (already gone is fine) and syncs its directory so
// that the removal survives a crash.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the creations, renames and removals in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory %s to sync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

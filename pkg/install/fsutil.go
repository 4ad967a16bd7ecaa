package install

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// fileMeta is what we keep of a file besides its bytes: enough to put it
// back exactly as it was.
type fileMeta struct {
	Mode fs.FileMode `json:"mode"`
	UID  int         `json:"uid"`
	GID  int         `json:"gid"`
}

func metaOf(fi fs.FileInfo) fileMeta {
	m := fileMeta{Mode: fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), UID: -1, GID: -1}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m.UID, m.GID = int(st.Uid), int(st.Gid)
	}
	return m
}

// readFile returns the file's bytes and metadata, or ok=false when there is
// no file at path.
//
// A symbolic link is an error: replacing it would turn it into a file, and
// writing through it would change a file elsewhere that we cannot restore
// under the same name.
func readFile(path string) (data []byte, meta fileMeta, ok bool, err error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fileMeta{}, false, fmt.Errorf("%s is a symbolic link: cni-usernet does not edit through links", path)
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fileMeta{}, false, nil
	}
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("examining %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fileMeta{}, false, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	data, err = io.ReadAll(f)
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, metaOf(fi), true, nil
}

func sum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// tempPrefix names our temporary files: dot-prefixed and with an extension
// (".tmp…") that libcni.ConfFiles never matches, so neither containerd nor
// CRI-O load a half-written configuration, and a runtime never executes a
// half-copied binary (it only runs a plugin by its "type").
func tempPrefix(path string) string {
	return "." + filepath.Base(path) + ".tmp"
}

// writeAtomic replaces path with the bytes from r through a temporary file
// in the same directory: written, given meta's mode and owner, synced,
// renamed, and the directory synced so that the rename survives a crash.
// The temporary file is removed on any error. A negative UID or GID leaves
// the owner to the process.
func writeAtomic(path string, r io.Reader, meta fileMeta) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix(path)+"*")
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
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, path, err)
	}
	done = true
	return syncDir(dir)
}

// removeFile removes path (already gone is fine) and syncs its directory.
func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
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

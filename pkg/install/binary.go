package install

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// binaryMode is what a runtime needs to execute the plugin.
const binaryMode fs.FileMode = 0o755

// InstallBinary copies Source to BinDir/Name through a temporary file in
// BinDir (synced, mode 0755, renamed over the old one, so a runtime starting
// the plugin at that moment runs either the old or the new binary, never a
// partial one). It writes nothing when the installed binary already has
// the same content and is executable. Before the first change it records
// whether a binary was there and keeps a copy of it, for Uninstall.
func InstallBinary(o Options) (changed bool, err error) {
	if err := o.Validate(); err != nil {
		return false, fmt.Errorf("installing the binary: %w", err)
	}
	if o.Source == "" || o.BinDir == "" {
		return false, errors.New("installing the binary: need a source and a plugin directory")
	}
	unlock, err := lock(o.RecordPath)
	if err != nil {
		return false, err
	}
	defer unlock()

	src, err := os.Open(o.Source)
	if err != nil {
		return false, fmt.Errorf("opening the binary to install: %w", err)
	}
	defer src.Close()
	dest := filepath.Join(o.BinDir, o.Name)
	cur, err := os.Lstat(dest)
	exists := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("examining installed binary: %w", err)
	case !cur.Mode().IsRegular():
		return false, fmt.Errorf("installed binary %s is not a regular file (%s): refusing to replace it", dest, cur.Mode().Type())
	}
	if exists && cur.Mode().Perm()&0o111 != 0 {
		same, err := sameContent(src, dest)
		if err != nil {
			return false, err
		}
		if same {
			return false, nil
		}
	}

	rec, err := loadRecord(o.RecordPath)
	if err != nil {
		return false, err
	}
	meta := fileMeta{Mode: binaryMode, UID: -1, GID: -1}
	if exists {
		meta.UID, meta.GID = metaOf(cur).UID, metaOf(cur).GID
	}
	if rec.Binary == nil {
		rb := &binaryRecord{}
		if exists {
			rb.Existed, rb.Meta = true, metaOf(cur)
			rb.Backup = filepath.Base(backupPath(o.RecordPath, o.Name))
			if err := copyFile(dest, backupPath(o.RecordPath, o.Name), fileMeta{Mode: 0o600, UID: -1, GID: -1}); err != nil {
				return false, fmt.Errorf("keeping a copy of the binary we replace: %w", err)
			}
		}
		rec.Binary = rb
		rec.BinDir = o.BinDir
		if err := rec.saveBeforeChange(o.RecordPath); err != nil {
			return false, err
		}
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("rewinding %s: %w", o.Source, err)
	}
	if err := writeAtomic(dest, src, meta); err != nil {
		return false, fmt.Errorf("installing the binary: %w", err)
	}
	return true, nil
}

// sameContent compares src (from its start) with the file at path.
func sameContent(src *os.File, path string) (bool, error) {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("rewinding %s: %w", src.Name(), err)
	}
	dst, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", path, err)
	}
	defer dst.Close()
	a, b := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, errA := io.ReadFull(src, a)
		nb, errB := io.ReadFull(dst, b)
		if !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		endA := errors.Is(errA, io.EOF) || errors.Is(errA, io.ErrUnexpectedEOF)
		endB := errors.Is(errB, io.EOF) || errors.Is(errB, io.ErrUnexpectedEOF)
		switch {
		case errA != nil && !endA:
			return false, fmt.Errorf("reading %s: %w", src.Name(), errA)
		case errB != nil && !endB:
			return false, fmt.Errorf("reading %s: %w", path, errB)
		case endA || endB:
			return endA && endB, nil
		}
	}
}

func copyFile(from, to string, meta fileMeta) error {
	f, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("opening %s: %w", from, err)
	}
	defer f.Close()
	return writeAtomic(to, f, meta)
}

package install

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// binaryMode is what a runtime needs to execute the plugin and the stack.
const binaryMode fs.FileMode = 0o755

// InstallBinary installs the stack's binary StackSource as
// BinDir/StackName(Name), when StackSource is given, then the plugin
// binary Source as BinDir/Name. The stack goes first so that a runtime
// never runs a new plugin beside a missing or older stack binary.
//
// Each is copied through a temporary file in BinDir (synced, mode 0755,
// renamed over the old one, so a runtime starting it at that moment runs
// either the old or the new binary, never a partial one). Nothing is
// written for a file already installed with the same content and
// executable. Before the first change to each file it records whether a
// binary was there and keeps a copy of it, for Uninstall. changed says
// whether any file changed, also with an error from the plugin binary
// after the stack binary changed.
//
// The meta plugins' binaries (Helpers) go first, each only where the
// node has no binary of that name or has one we installed.
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

	// The helpers first: the plugin's configuration names them, and the
	// configuration is written after InstallBinary.
	for _, h := range o.Helpers {
		c, err := installHelper(&o, h)
		if err != nil {
			return changed, fmt.Errorf("installing the %s plugin: %w", h.Name, err)
		}
		changed = changed || c
	}
	if o.StackSource != "" {
		c, err := installBinaryFile(&o, o.StackSource, StackName(o.Name), func(r *record) **binaryRecord { return &r.Stack })
		if err != nil {
			return false, fmt.Errorf("installing the stack binary: %w", err)
		}
		changed = c
	}
	c, err := installBinaryFile(&o, o.Source, o.Name, func(r *record) **binaryRecord { return &r.Binary })
	if err != nil {
		return changed, fmt.Errorf("installing the plugin binary: %w", err)
	}
	return changed || c, nil
}

// installBinaryFile installs the file at source as BinDir/name, with the
// guarantees InstallBinary describes. slot picks the record's entry for
// name; the record is read only when the file is about to change, so an
// install that changes nothing does not depend on it.
func installBinaryFile(o *Options, source, name string, slot func(*record) **binaryRecord) (changed bool, err error) {
	src, err := os.Open(source)
	if err != nil {
		return false, fmt.Errorf("opening the binary to install: %w", err)
	}
	defer src.Close()
	dest := filepath.Join(o.BinDir, name)
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
	if rb := slot(rec); *rb == nil {
		b := &binaryRecord{}
		if exists {
			backup := backupPath(o.RecordPath, name)
			b.Existed, b.Meta, b.Backup = true, metaOf(cur), filepath.Base(backup)
			if err := copyFile(dest, backup, fileMeta{Mode: 0o600, UID: -1, GID: -1}); err != nil {
				return false, fmt.Errorf("keeping a copy of the binary we replace: %w", err)
			}
		}
		*rb = b
		rec.BinDir = o.BinDir
		if err := rec.saveBeforeChange(o.RecordPath); err != nil {
			return false, err
		}
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("rewinding %s: %w", source, err)
	}
	if err := writeAtomic(dest, src, meta); err != nil {
		return false, fmt.Errorf("writing %s: %w", dest, err)
	}
	return true, nil
}

// installHelper installs h.Source as BinDir/h.Name when the node has no
// binary of that name, or has one we wrote (an older version of ours);
// a binary of the node's own stays as it is.
func installHelper(o *Options, h Helper) (changed bool, err error) {
	src, err := os.Open(h.Source)
	if err != nil {
		return false, fmt.Errorf("opening the binary to install: %w", err)
	}
	defer src.Close()
	srcSum, err := readerSum(src)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", h.Source, err)
	}
	dest := filepath.Join(o.BinDir, h.Name)
	cur, err := os.Lstat(dest)
	exists := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("examining installed binary: %w", err)
	case !cur.Mode().IsRegular():
		// A link to the distribution's plugins, say: the node's own.
		o.log().Info("keeping the node's own plugin binary", "path", dest, "type", cur.Mode().Type().String())
		return false, nil
	}
	var curSum string
	if exists {
		if curSum, err = pathSum(dest); err != nil {
			return false, err
		}
		// Ours or the node's, nothing to do: the record is read only when
		// something may change.
		if curSum == srcSum && cur.Mode().Perm()&0o111 != 0 {
			return false, nil
		}
	}
	rec, err := loadRecord(o.RecordPath)
	if err != nil {
		return false, err
	}
	hr := rec.helper(h.Name)
	if exists && (hr == nil || !hr.wrote(curSum)) {
		o.log().Info("keeping the node's own plugin binary", "path", dest)
		return false, nil
	}
	if hr == nil {
		hr = &helperRecord{Name: h.Name}
		rec.Helpers = append(rec.Helpers, hr)
	}
	if !hr.wrote(srcSum) {
		hr.Written = append(hr.Written, srcSum)
	}
	rec.BinDir = o.BinDir
	if err := rec.saveBeforeChange(o.RecordPath); err != nil {
		return false, err
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("rewinding %s: %w", h.Source, err)
	}
	if err := writeAtomic(dest, src, fileMeta{Mode: binaryMode, UID: -1, GID: -1}); err != nil {
		return false, fmt.Errorf("writing %s: %w", dest, err)
	}
	return true, nil
}

func readerSum(r io.ReadSeeker) (string, error) {
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func pathSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	s, err := readerSum(f)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return s, nil
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

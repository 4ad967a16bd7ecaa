package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Uninstall puts back what RecordPath says was there before: files we
// created are removed, files we changed or removed get their old bytes,
// mode and owner back, the plugin binary and the stack's binary beside
// it are each removed or the one we replaced is restored; then the record
// goes. It works from the record alone: StackSource and Source are not
// needed. A configuration file that someone else rewrote after our last
// change is not restored: only our plugin entry is taken out of it, so
// their change survives. Nothing recorded is success.
//
// On error the record stays, so that running Uninstall again finishes the
// job.
func Uninstall(o Options) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("uninstalling: %w", err)
	}
	unlock, err := lock(o.RecordPath)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := loadRecord(o.RecordPath)
	if err != nil {
		return err
	}
	confDir := o.ConfDir
	if confDir == "" {
		confDir = rec.ConfDir
	}
	binDir := o.BinDir
	if binDir == "" {
		binDir = rec.BinDir
	}

	var errs []error
	// Configuration before the binary, so that no runtime reads a
	// configuration naming a plugin that is gone. Files that existed
	// before us come back before the ones we created go, so that a
	// converted .conf is back before its .conflist disappears.
	for _, existed := range []bool{true, false} {
		for _, f := range rec.Files {
			if f.Existed == existed {
				if err := restoreFile(&o, filepath.Join(confDir, f.Name), f); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// The plugin before the stack's binary, the reverse of
	// InstallBinary: a plugin still installed must not find its stack
	// binary gone or older, so a failure with the plugin leaves the stack
	// binary alone.
	binaries := []struct {
		what, name string
		rec        *binaryRecord
	}{
		{"plugin binary", o.Name, rec.Binary},
		{"stack binary", StackName(o.Name), rec.Stack},
	}
	for _, b := range binaries {
		if len(errs) == 0 && b.rec != nil {
			if err := restoreBinary(&o, filepath.Join(binDir, b.name), b.rec); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", b.what, err))
			}
		}
	}
	// The helpers last: a configuration still naming them is gone.
	for _, h := range rec.Helpers {
		if len(errs) == 0 {
			if err := removeHelper(&o, filepath.Join(binDir, h.Name), h); err != nil {
				errs = append(errs, fmt.Errorf("the %s plugin: %w", h.Name, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstalling (the record %s stays for another try): %w", o.RecordPath, errors.Join(errs...))
	}
	for _, b := range binaries {
		if b.rec != nil && b.rec.Backup != "" {
			if err := removeFile(filepath.Join(filepath.Dir(o.RecordPath), b.rec.Backup)); err != nil {
				return err
			}
		}
	}
	return removeFile(o.RecordPath)
}

func restoreFile(o *Options, path string, f *fileRecord) error {
	log := o.log().With("file", path)
	cur, meta, exists, err := readFile(path)
	if err != nil {
		return err
	}
	switch {
	case !exists && f.Removed:
		log.Info("restoring the configuration we replaced")
		return writeAtomic(path, bytes.NewReader(f.Data), f.Meta)
	case !exists:
		// Never created (a crash after the record), or removed by someone
		// else since: either way nothing of ours is there.
		return nil
	case f.wrote(cur) && f.Existed && !f.StripOnly:
		log.Info("restoring the configuration as it was before us")
		return writeAtomic(path, bytes.NewReader(f.Data), f.Meta)
	case f.wrote(cur) && !f.Existed:
		log.Info("removing the configuration we created")
		return removeFile(path)
	case f.Removed && !f.wrote(cur):
		// Written again by its owner since we removed it (flannel's init
		// container recreating its .conf): theirs, as it is.
		return nil
	case f.Existed && !f.StripOnly && bytes.Equal(cur, f.Data):
		// Already as before: the change was never made, or a previous
		// Uninstall got this far.
		return nil
	}
	// Someone rewrote the file after us, or it held our entry already
	// when we captured it: take out only what is ours.
	c, err := parseConflist(cur)
	if err != nil {
		log.Warn("leaving a configuration we did not write and cannot parse", "err", err)
		return nil
	}
	ours := c.strip(o.Name)
	if added := c.stripSame(f.Added, func(string) bool { return false }); !ours && !added {
		return nil
	}
	if len(c.plugins) == 0 {
		log.Warn("leaving a configuration someone else rewrote with only our plugin in it")
		return nil
	}
	out, err := c.marshal()
	if err != nil {
		return fmt.Errorf("removing our plugin from %s: %w", path, err)
	}
	log.Info("removing our plugin from a configuration someone else rewrote")
	if err := writeAtomic(path, bytes.NewReader(out), meta); err != nil {
		return fmt.Errorf("removing our plugin: %w", err)
	}
	return nil
}

// removeHelper removes a meta plugin's binary we installed, unless
// someone has replaced it since (a package of the node's installing its
// own): that one is theirs.
func removeHelper(o *Options, path string, h *helperRecord) error {
	cur, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("examining %s: %w", path, err)
	}
	if cur.Mode().IsRegular() {
		s, err := pathSum(path)
		if err != nil {
			return err
		}
		if h.wrote(s) {
			return removeFile(path)
		}
	}
	o.log().Info("leaving a plugin binary someone replaced after us", "path", path)
	return nil
}

func restoreBinary(o *Options, path string, b *binaryRecord) error {
	if !b.Existed {
		return removeFile(path)
	}
	backup := filepath.Join(filepath.Dir(o.RecordPath), b.Backup)
	orig, err := os.Open(backup)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restoring the binary we replaced: its copy %s is gone", backup)
	}
	if err != nil {
		return fmt.Errorf("restoring the binary we replaced: %w", err)
	}
	defer orig.Close()
	if cur, err := os.Lstat(path); err == nil && cur.Mode().IsRegular() && metaOf(cur) == b.Meta {
		if same, err := sameContent(orig, path); err != nil {
			return err
		} else if same {
			return nil
		}
	}
	if _, err := orig.Seek(0, 0); err != nil {
		return fmt.Errorf("rewinding %s: %w", backup, err)
	}
	if err := writeAtomic(path, orig, b.Meta); err != nil {
		return fmt.Errorf("restoring the binary we replaced: %w", err)
	}
	return nil
}

package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// confExtensions are the files containerd (go-cni) and CRI-O consider;
// containerd uses the lexically first of them.
var confExtensions = []string{".conf", ".conflist", ".json"}

// confMode is the mode of a configuration file we create from nothing.
const confMode = 0o644

// InstallConfig writes (Standalone) or edits (Chain) the CNI
// configuration and returns the file that the runtime will use. The
// previous state of every file it touches is recorded in RecordPath
// before the file changes; each write is atomic and keeps the mode and
// owner of the file it replaces. A call that would change nothing writes
// nothing, not even the record.
//
// Chain mode returns an error wrapping ErrNothingToChain while the
// directory holds no configuration: the caller retries later.
func InstallConfig(o Options) (path string, changed bool, err error) {
	if err := o.validateConfig(); err != nil {
		return "", false, fmt.Errorf("installing the CNI configuration: %w", err)
	}
	unlock, err := lock(o.RecordPath)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	rec, err := loadRecord(o.RecordPath)
	if err != nil {
		return "", false, err
	}
	if rec.Mode != "" && rec.Mode != o.Mode && len(rec.Files) > 0 {
		return "", false, fmt.Errorf("installing in %s mode: %w (record %s says %s)", o.Mode, ErrModeChange, o.RecordPath, rec.Mode)
	}
	files, err := confFiles(o.ConfDir)
	if err != nil {
		return "", false, err
	}
	var target string
	var steps []step
	if o.Mode == Standalone {
		target, steps, err = planStandalone(&o, rec, files)
	} else {
		target, steps, err = planChain(&o, rec, files)
	}
	if err != nil {
		return "", false, err
	}
	changed, err = apply(&o, rec, steps)
	return target, changed, err
}

// confFiles lists the configuration files as a runtime does, sorted.
func confFiles(dir string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, confExtensions)
	if err != nil {
		return nil, fmt.Errorf("listing CNI configurations in %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// step is one file change: write data, or remove the file when data is
// nil. meta is the mode and owner for a file that does not exist yet.
type step struct {
	path string
	data []byte
	meta fileMeta
	// added are the plugin objects of Options.After this write puts
	// into the list.
	added []json.RawMessage
}

// planStandalone writes the conflist as 05-<name>.conflist, or as
// 00-<name>.conflist when another configuration would sort before that,
// and removes a conflist of ours left under the other name. A directory
// where something sorts before 00-<name>.conflist too is refused: a
// cleverer name would only start a race with that installer.
func planStandalone(o *Options, rec *record, files []string) (string, []step, error) {
	l, err := libcni.ConfListFromBytes(o.Conflist)
	if err != nil {
		return "", nil, fmt.Errorf("checking the conflist to install: %w", err)
	}
	if err := o.checkVersion("the conflist to install", l.CNIVersion); err != nil {
		return "", nil, err
	}
	c, err := parseConflist(o.Conflist)
	if err != nil {
		return "", nil, fmt.Errorf("checking the conflist to install: %w", err)
	}
	if !c.has(o.Name) {
		return "", nil, fmt.Errorf("the conflist to install has no plugin of type %q", o.Name)
	}

	candidates := []string{
		filepath.Join(o.ConfDir, "05-"+o.Name+".conflist"),
		filepath.Join(o.ConfDir, "00-"+o.Name+".conflist"),
	}
	// Files holding something we wrote are ours to replace or remove;
	// everything else must sort after the name we choose.
	ours := map[string]bool{}
	var others []string
	for _, f := range files {
		if e := rec.file(filepath.Base(f)); e != nil {
			// Not ours when unreadable or a link: we never write links.
			if data, _, ok, err := readFile(f); err == nil && ok && e.wrote(data) {
				ours[f] = true
				continue
			}
		}
		others = append(others, f)
	}
	first := func(c string) bool { return len(others) == 0 || c <= others[0] }
	target := ""
	// A name that already holds exactly this conflist keeps it: a second
	// run must not move the file.
	for _, c := range candidates {
		if ours[c] && first(c) {
			if data, _, _, err := readFile(c); err == nil && bytes.Equal(data, o.Conflist) {
				target = c
				break
			}
		}
	}
	for _, c := range candidates {
		if target == "" && first(c) {
			target = c
		}
	}
	if target == "" {
		return "", nil, fmt.Errorf("installing %s: %w: %s sorts before it, and containerd uses only the first file", candidates[1], ErrNotFirst, others[0])
	}
	steps := []step{{path: target, data: o.Conflist, meta: fileMeta{Mode: confMode, UID: -1, GID: -1}}}
	for _, c := range candidates {
		if c != target && ours[c] {
			steps = append(steps, step{path: c})
		}
	}
	return target, steps, nil
}

// planChain puts our plugin into the first configuration, the one
// containerd uses. A .conflist is edited under its own name. A single
// plugin file (.conf, .json) cannot hold a second plugin: it becomes a
// .conflist of the same base name, written first, and the original file is
// removed afterwards, so that at every moment one of the two is the first
// configuration.
func planChain(o *Options, rec *record, files []string) (string, []step, error) {
	if len(files) == 0 {
		return "", nil, fmt.Errorf("chaining into %s: %w: no CNI configuration in it", o.ConfDir, ErrNothingToChain)
	}
	first := files[0]
	data, meta, _, err := readFile(first)
	if err != nil {
		return "", nil, fmt.Errorf("chaining: %w", err)
	}
	isList := strings.HasSuffix(first, ".conflist")
	var c *conflist
	var version string // as the runtime will read it (libcni resolves "cniVersions")
	if isList {
		l, err := libcni.ConfListFromBytes(data)
		if err != nil {
			return "", nil, fmt.Errorf("chaining into %s, which runtimes cannot load either: %w", first, err)
		}
		version = l.CNIVersion
		if c, err = parseConflist(data); err != nil {
			return "", nil, fmt.Errorf("chaining into %s: %w", first, err)
		}
	} else {
		p, err := libcni.ConfFromBytes(data)
		if err != nil {
			return "", nil, fmt.Errorf("chaining into %s, which runtimes cannot load either: %w", first, err)
		}
		version = p.Network.CNIVersion
		if c, err = listFromConf(data); err != nil {
			return "", nil, fmt.Errorf("chaining into %s: %w", first, err)
		}
	}
	if pluginType(c.plugins[0]) == o.Name {
		return "", nil, fmt.Errorf("chaining into %s: %w (its first plugin is %s, a standalone configuration): uninstall it, or install in standalone mode", first, ErrOwnConfig, o.Name)
	}
	if err := o.checkVersion(first, version); err != nil {
		return "", nil, fmt.Errorf("chaining: %w", err)
	}
	target := first
	if !isList {
		target = strings.TrimSuffix(first, filepath.Ext(first)) + ".conflist"
	}
	changed := c.chain(o.Name, o.Plugin)
	wanted := map[string]bool{}
	for _, a := range o.After {
		wanted[pluginType(a)] = true
	}
	if e := rec.file(filepath.Base(target)); e != nil {
		if c.stripSame(e.Added, func(typ string) bool { return wanted[typ] }) {
			changed = true
		}
	}
	added := c.addAfter(o.Name, o.After)
	if len(added) > 0 {
		changed = true
	}
	if isList && !changed {
		return first, nil, nil
	}
	out, err := c.marshal()
	if err != nil {
		return "", nil, fmt.Errorf("chaining into %s: %w", first, err)
	}
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		return "", nil, fmt.Errorf("chaining into %s: the result does not load: %w", first, err)
	}
	if isList {
		return first, []step{{path: first, data: out, meta: meta, added: added}}, nil
	}
	for _, f := range files[1:] {
		if f < target {
			return "", nil, fmt.Errorf("chaining into %s: %s would sort before %s once %s is gone", first, f, target, filepath.Base(first))
		}
	}
	return target, []step{{path: target, data: out, meta: meta, added: added}, {path: first}}, nil
}

// apply records the state each step is about to change and then makes the
// changes, in order. Steps that change no byte are dropped; when none is
// left, nothing is written at all.
func apply(o *Options, rec *record, steps []step) (bool, error) {
	var work []step
	for _, s := range steps {
		name := filepath.Base(s.path)
		cur, meta, exists, err := readFile(s.path)
		if err != nil {
			return false, err
		}
		if s.data == nil && !exists || s.data != nil && exists && bytes.Equal(cur, s.data) {
			continue
		}
		e := rec.file(name)
		ours := e != nil && exists && e.wrote(cur)
		if e == nil {
			e = &fileRecord{Name: name}
			rec.Files = append(rec.Files, e)
		}
		if !ours {
			// First change, or someone (Calico's installer, flannel's
			// init container, an operator) rewrote the file after us:
			// what is there now is what Uninstall restores.
			// What we added to it earlier stays ours to take out.
			*e = fileRecord{Name: name, Existed: exists, Data: cur, Meta: meta, Added: e.Added}
			// In chain mode our entries in it came from an earlier run of
			// ours and must not come back with the restore. A standalone
			// file is restored whole: it was someone's configuration.
			if exists && s.data != nil && o.Mode == Chain {
				if c, err := parseConflist(cur); err == nil && (c.has(o.Name) || c.hasAny(e.Added)) {
					e.StripOnly = true
				}
			}
		}
		if s.data == nil {
			e.Removed = e.Existed
		} else {
			e.Removed = false
			e.addWritten(s.data)
			e.addAdded(s.added)
			if exists {
				s.meta = meta
			}
		}
		work = append(work, s)
	}
	if len(work) == 0 {
		return false, nil
	}
	rec.Mode = o.Mode
	rec.ConfDir = o.ConfDir
	if err := rec.saveBeforeChange(o.RecordPath); err != nil {
		return false, err
	}
	for _, w := range work {
		if w.data == nil {
			if err := removeFile(w.path); err != nil {
				return false, err
			}
			continue
		}
		if err := writeAtomic(w.path, bytes.NewReader(w.data), w.meta); err != nil {
			return false, fmt.Errorf("writing CNI configuration: %w", err)
		}
	}
	return true, nil
}

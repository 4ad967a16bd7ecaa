package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// recordVersion is bumped when the record's meaning changes; an older
// binary refuses a newer record rather than misreading it.
const recordVersion = 1

// record is what RecordPath holds: the state of every file before our
// first change to it, and what we wrote since. It is saved before each
// change it describes, so it may describe a change that never happened
// (a crash in between); Uninstall tells the two apart by content.
type record struct {
	Version int `json:"version"`
	// Mode of the configuration entries; empty until InstallConfig.
	Mode Mode `json:"mode,omitempty"`
	// BinDir and ConfDir as the installer saw them; file entries are
	// relative to them so that Uninstall can run with another view of
	// the same directories (the host's instead of a container's).
	BinDir  string `json:"binDir,omitempty"`
	ConfDir string `json:"confDir,omitempty"`
	// Binary is nil until InstallBinary first changed the plugin binary.
	Binary *binaryRecord `json:"binary,omitempty"`
	// Stack is nil until InstallBinary first changed the stack's binary
	// (StackName(Name)). Records written before there was one lack it,
	// which means the same.
	Stack *binaryRecord `json:"stack,omitempty"`
	// Helpers are the meta plugins' binaries we created in BinDir
	// (Options.Helpers); a binary the node had is never recorded, as we
	// never touch it.
	Helpers []*helperRecord `json:"helpers,omitempty"`
	// Files are the configuration files we changed, created or removed,
	// in the order we first touched them.
	Files []*fileRecord `json:"files,omitempty"`
}

type helperRecord struct {
	// Name is the binary's name in BinDir.
	Name string `json:"name"`
	// Written are the SHA-256 sums of every version we wrote there: a
	// binary with another content was put there by someone else after
	// us, and is theirs.
	Written []string `json:"written"`
}

func (h *helperRecord) wrote(sum string) bool { return slices.Contains(h.Written, sum) }

func (r *record) helper(name string) *helperRecord {
	for _, h := range r.Helpers {
		if h.Name == name {
			return h
		}
	}
	return nil
}

type binaryRecord struct {
	// Existed: a binary was at its place in BinDir (Name for Binary,
	// StackName(Name) for Stack) before our first change; a copy of it
	// is in Backup (a file name in the record's directory) with its
	// Meta.
	Existed bool     `json:"existed"`
	Backup  string   `json:"backup,omitempty"`
	Meta    fileMeta `json:"meta,omitzero"`
}

type fileRecord struct {
	// Name is the file's name in ConfDir.
	Name string `json:"name"`
	// Existed: a file was there before our first change; Data and Meta
	// are its bytes, mode and owner.
	Existed bool     `json:"existed"`
	Data    []byte   `json:"data,omitempty"`
	Meta    fileMeta `json:"meta,omitzero"`
	// StripOnly: the file already held our plugin when we captured it
	// (someone rewrote it with our entry kept), so Data cannot be put
	// back: Uninstall removes our entry instead.
	StripOnly bool `json:"stripOnly,omitempty"`
	// Removed: we deleted the file (a single-plugin .conf that we turned
	// into a .conflist); Uninstall puts it back.
	Removed bool `json:"removed,omitempty"`
	// Written are the SHA-256 sums of everything we wrote there. A file
	// whose content is one of them is ours to undo; any other content
	// was written by someone else after us.
	Written []string `json:"written,omitempty"`
	// Added are the plugin objects (Options.After) we put into the list
	// beside ours: taken out with ours when only our entries can be
	// removed (StripOnly, or a file someone rewrote since).
	Added []json.RawMessage `json:"added,omitempty"`
}

func (f *fileRecord) addAdded(objs []json.RawMessage) {
	for _, o := range objs {
		if !slices.ContainsFunc(f.Added, func(a json.RawMessage) bool { return sameJSON(a, o) }) {
			f.Added = append(f.Added, o)
		}
	}
}

func (f *fileRecord) wrote(data []byte) bool {
	return slices.Contains(f.Written, sum(data))
}

func (f *fileRecord) addWritten(data []byte) {
	if s := sum(data); !slices.Contains(f.Written, s) {
		f.Written = append(f.Written, s)
	}
}

func (r *record) file(name string) *fileRecord {
	for _, f := range r.Files {
		if f.Name == name {
			return f
		}
	}
	return nil
}

func (r *record) empty() bool {
	return r.Binary == nil && r.Stack == nil && len(r.Helpers) == 0 && len(r.Files) == 0
}

// loadRecord reads the record; no file is an empty record.
func loadRecord(path string) (*record, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &record{Version: recordVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading install record: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parsing install record %s: %w", path, err)
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("install record %s has version %d, this binary understands %d", path, r.Version, recordVersion)
	}
	return &r, nil
}

// save writes the record atomically and makes the rename durable before
// the change it describes is made.
func (r *record) save(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding install record: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("saving install record: %w", err)
	}
	return nil
}

// backupPath is where the copy of a binary we replaced is kept; name is
// the binary's file name, so the plugin's and the stack's copies differ.
func backupPath(recordPath, name string) string {
	return recordPath + "." + name + ".orig"
}

// crashAfterRecord, when set by a test, runs after the record is saved and
// before the change it describes; an error stops there, as a crash would.
var crashAfterRecord func() error

func (r *record) saveBeforeChange(path string) error {
	if err := r.save(path); err != nil {
		return err
	}
	if crashAfterRecord != nil {
		return crashAfterRecord()
	}
	return nil
}

// Package install puts cni-usernet on a node and takes it off again: the
// plugin binary and, beside it, the binary the plugin starts pods' stacks
// from (StackName), the CNI configuration (our own conflist, or our plugin
// chained into the node's), and a record of what was there before so that
// Uninstall leaves the node exactly as it found it.
//
// Every change is a transaction: the record of the previous state is
// written first, then each file is replaced through a temporary file and a
// rename, so that a runtime never reads a torn file and a crash at any
// point still uninstalls correctly. A change that would not change any
// byte is not made at all. docs/install.md describes the behaviour for
// operators.
package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/util/flock"
)

// RecordName is the install record's path under the plugin's state
// directory (netconf.DefaultStateDir, or the agent's --state-dir), for
// the agent and the install and uninstall commands alike: a directory of
// its own, since the state directory's top level is one file per
// attachment.
const RecordName = "install/install.json"

// Mode says how the CNI configuration is installed.
type Mode string

const (
	// Standalone writes our own conflist, named to sort first in the
	// configuration directory.
	Standalone Mode = "standalone"
	// Chain appends our plugin to the node's first configuration, for
	// clusters that keep Calico, Cilium or flannel for routing and policy.
	Chain Mode = "chain"
)

// Options says what to install and where. The zero value of each field is
// described with it.
type Options struct {
	// Source is the binary to install (the agent passes its own
	// executable). Needed by InstallBinary only.
	Source string
	// StackSource is the stack's binary, installed by InstallBinary as
	// BinDir/StackName(Name) beside the plugin (the plugin starts pods'
	// stacks from it when present). Empty: only the plugin binary is
	// installed.
	StackSource string
	// BinDir is the runtime's plugin directory, e.g. /host/opt/cni/bin.
	// Uninstall falls back to the directory recorded at install time when
	// it is empty.
	BinDir string
	// ConfDir is the runtime's configuration directory, e.g.
	// /host/etc/cni/net.d. Uninstall falls back to the recorded one when
	// it is empty.
	ConfDir string
	// Name is the binary's name in BinDir and the plugin "type" in
	// configurations. Required.
	Name string
	// Mode is how InstallConfig installs the configuration. Required by
	// InstallConfig.
	Mode Mode
	// Conflist is, in Standalone mode, the whole conflist to write. It
	// must load with libcni and contain a plugin of type Name.
	Conflist []byte
	// Plugin is, in Chain mode, the plugin object to insert, with
	// "type": Name.
	Plugin []byte
	// After are, in Chain mode, plugin objects (portmap, bandwidth) put
	// after ours, each only when the list has no plugin of its type
	// (flannel's list brings its own portmap; Calico's both): a second
	// portmap would map every hostPort twice. An entry we added earlier
	// whose type is no longer among them is taken out again. Nil: none.
	After [][]byte
	// Helpers are the binaries of the meta plugins the configuration
	// chains (portmap, bandwidth), installed by InstallBinary as
	// BinDir/Name. A node that has a binary of that name keeps it (its
	// distribution's or its primary network plugin's, which other
	// configurations may run too); only a binary we installed ourselves
	// is updated, and only those are removed by Uninstall. Nil: none.
	Helpers []Helper
	// RecordPath is where Install records what it replaced and created,
	// for Uninstall (the agent and the install command pass RecordName
	// under the state directory).
	// Its directory also holds a copy of a binary we replaced and a lock
	// file. Required.
	RecordPath string
	// CNIVersions are the configuration versions the plugin supports;
	// InstallConfig refuses a configuration of any other version, which
	// the plugin would fail on every ADD. Nil means
	// netconf.CNIVersions.
	CNIVersions []string
	// Log receives what Uninstall leaves alone and why. Nil discards.
	Log *slog.Logger
}

// Helper is a meta plugin's binary to install beside ours.
type Helper struct {
	// Name is the file name in BinDir, the plugin's "type". Required.
	Name string
	// Source is the binary to copy. Required.
	Source string
}

// Errors a caller may want to tell apart with errors.Is.
var (
	// ErrNothingToChain: Chain mode found no configuration to chain to.
	// The node's network plugin has not written its configuration yet;
	// try again later.
	ErrNothingToChain = errors.New("nothing to chain to yet")
	// ErrOwnConfig: Chain mode found our own standalone conflist first.
	ErrOwnConfig = errors.New("the first configuration is cni-usernet's own")
	// ErrNotFirst: Standalone mode cannot name its conflist so that it
	// sorts first.
	ErrNotFirst = errors.New("cannot name the conflist so that it sorts first")
	// ErrModeChange: the configuration was installed in the other mode.
	ErrModeChange = errors.New("configuration installed in another mode: uninstall first")
)

// StackName is the file name, in the plugin directory, of the stack's
// binary that goes with the plugin binary named name.
func StackName(name string) string { return name + "-stack" }

// Validate checks what every operation needs.
func (o *Options) Validate() error {
	if o.Name == "" {
		return errors.New("no plugin name")
	}
	if err := checkFileName("plugin", o.Name); err != nil {
		return err
	}
	// Checked even without StackSource: Uninstall finds the stack binary
	// by this name.
	if err := checkFileName("stack binary", StackName(o.Name)); err != nil {
		return err
	}
	if o.RecordPath == "" {
		return errors.New("no record path")
	}
	for _, h := range o.Helpers {
		if err := checkFileName("helper", h.Name); err != nil {
			return err
		}
		if h.Name == "" || h.Name == o.Name || h.Name == StackName(o.Name) || h.Source == "" {
			return fmt.Errorf("helper %q: want a source and a name of its own", h.Name)
		}
	}
	return nil
}

// checkFileName refuses a name that would put a file outside BinDir, or
// be BinDir itself.
func checkFileName(what, name string) error {
	if strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return fmt.Errorf("%s name %q is not a file name", what, name)
	}
	return nil
}

func (o *Options) validateConfig() error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.ConfDir == "" {
		return errors.New("no CNI configuration directory")
	}
	switch o.Mode {
	case Standalone:
		if len(o.Conflist) == 0 {
			return errors.New("standalone mode needs a conflist")
		}
	case Chain:
		if len(o.Plugin) == 0 {
			return errors.New("chain mode needs a plugin object")
		}
		var p map[string]json.RawMessage
		if err := json.Unmarshal(o.Plugin, &p); err != nil {
			return fmt.Errorf("plugin object to chain is not a JSON object: %w", err)
		}
		if t := pluginType(o.Plugin); t != o.Name {
			return fmt.Errorf("plugin object to chain has type %q, want %q", t, o.Name)
		}
		for _, a := range o.After {
			if t := pluginType(a); t == "" || t == o.Name {
				return fmt.Errorf("plugin object to chain after ours has type %q: want another plugin's", t)
			}
		}
	default:
		return fmt.Errorf("mode %q: want %q or %q", o.Mode, Standalone, Chain)
	}
	return nil
}

func (o *Options) cniVersions() []string {
	if o.CNIVersions != nil {
		return o.CNIVersions
	}
	return netconf.CNIVersions
}

func (o *Options) checkVersion(what, v string) error {
	if !slices.Contains(o.cniVersions(), v) {
		return fmt.Errorf("%s has cniVersion %q; %s supports %s", what, v, o.Name, strings.Join(o.cniVersions(), ", "))
	}
	return nil
}

func (o *Options) log() *slog.Logger {
	if o.Log != nil {
		return o.Log
	}
	return slog.New(slog.DiscardHandler)
}

// lock serialises installers sharing a record (the agent, and an operator
// running the install or uninstall command by hand on the same node).
// The lock file stays: removing it would let a waiter lock an unlinked file.
func lock(recordPath string) (unlock func(), err error) {
	return flock.Lock(recordPath + ".lock")
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/install"
)

// installName is the binary's name in the plugin directory and the "type"
// configurations use.
const installName = "cni-usernet"

// installRecordDefault is where the agent keeps its record too.
var installRecordDefault = filepath.Join(netconf.DefaultStateDir, install.RecordName)

// installCommand is `cni-usernet install`: the binary first, the
// configuration last, so that no runtime reads a configuration naming a
// plugin it cannot find.
func installCommand(args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	binDir := fs.String("cni-bin-dir", "/opt/cni/bin", "plugin directory of the runtime")
	confDir := fs.String("cni-conf-dir", "/etc/cni/net.d", "configuration directory of the runtime")
	mode := fs.String("mode", string(install.Standalone), `"standalone" (write our own conflist, sorted first) or "chain" (add our plugin to the node's first configuration)`)
	conflist := fs.String("conflist", "", "standalone: the conflist to install")
	plugin := fs.String("plugin", "", "chain: file with the plugin object to add")
	record := fs.String("record", installRecordDefault, "where to record what was there before, for uninstall")
	source := fs.String("source", "", "binary to install (default: this executable)")
	stackSource := fs.String("stack-source", "", "the stack's binary to install beside it (default: the source's name with -stack appended, when that file exists)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("install: unexpected argument %q", fs.Arg(0))
	}
	o := install.Options{
		Source: *source, StackSource: *stackSource, BinDir: *binDir, ConfDir: *confDir, Name: installName,
		Mode: install.Mode(*mode), RecordPath: *record,
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	var err error
	switch o.Mode {
	case install.Standalone:
		if *conflist == "" || *plugin != "" {
			return errors.New("install: standalone mode takes --conflist FILE (and no --plugin)")
		}
		o.Conflist, err = os.ReadFile(*conflist)
	case install.Chain:
		if *plugin == "" || *conflist != "" {
			return errors.New("install: chain mode takes --plugin FILE (and no --conflist)")
		}
		o.Plugin, err = os.ReadFile(*plugin)
	default:
		return fmt.Errorf("install: --mode %q: want %q or %q", *mode, install.Standalone, install.Chain)
	}
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if o.Source == "" {
		if o.Source, err = os.Executable(); err != nil {
			return fmt.Errorf("install: finding this executable: %w", err)
		}
	}
	if o.StackSource == "" {
		if o.StackSource, err = attachment.StackBinary(o.Source); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}

	changed, err := install.InstallBinary(o)
	if err != nil {
		return err
	}
	what := o.Name
	if o.StackSource != "" {
		what += " and " + install.StackName(o.Name)
	}
	fmt.Printf("binaries %s in %s: %s\n", what, o.BinDir, installChangeWord(changed))
	path, changed, err := install.InstallConfig(o)
	if err != nil {
		return err
	}
	fmt.Printf("configuration %s: %s\n", path, installChangeWord(changed))
	return nil
}

// uninstallCommand is `cni-usernet uninstall`. The directories default
// to the ones recorded at install time; give them when this runs with
// another view of the same directories (on the host rather than in the
// agent's container).
func uninstallCommand(args []string) error {
	fs := flag.NewFlagSet("uninstall", flag.ContinueOnError)
	binDir := fs.String("cni-bin-dir", "", "plugin directory of the runtime (default: as recorded)")
	confDir := fs.String("cni-conf-dir", "", "configuration directory of the runtime (default: as recorded)")
	record := fs.String("record", installRecordDefault, "the record install wrote")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("uninstall: unexpected argument %q", fs.Arg(0))
	}
	return install.Uninstall(install.Options{
		BinDir: *binDir, ConfDir: *confDir, Name: installName, RecordPath: *record,
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}

func installChangeWord(changed bool) string {
	if changed {
		return "installed"
	}
	return "unchanged"
}

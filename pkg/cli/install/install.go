// Package install is the by-hand `cni-usernet install` and `uninstall`:
// their flags, read into the transaction pkg/node/install carries out
// for the agent too. A package of its own, small as it is, because it is
// a command of the plugin's binary, which the agent does not link.
package install

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	nodeinstall "github.com/cni-usernet/cni-usernet/pkg/node/install"
)

// name is the binary's name in the plugin directory and the "type"
// configurations use.
const name = "cni-usernet"

// recordDefault is where the agent keeps its record too.
var recordDefault = filepath.Join(netconf.DefaultStateDir, nodeinstall.RecordName)

// Run is `cni-usernet install`: the binary first, the configuration
// last, so that no runtime reads a configuration naming a plugin it
// cannot find. It reports on out what it changed and logs to errOut.
func Run(args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(errOut)
	binDir := fs.String("cni-bin-dir", "/opt/cni/bin", "plugin directory of the runtime")
	confDir := fs.String("cni-conf-dir", "/etc/cni/net.d", "configuration directory of the runtime")
	mode := fs.String("mode", string(nodeinstall.Standalone), `"standalone" (write our own conflist, sorted first) or "chain" (add our plugin to the node's first configuration)`)
	conflist := fs.String("conflist", "", "standalone: the conflist to install")
	plugin := fs.String("plugin", "", "chain: file with the plugin object to add")
	record := fs.String("record", recordDefault, "where to record what was there before, for uninstall")
	source := fs.String("source", "", "binary to install (default: this executable)")
	stackSource := fs.String("stack-source", "", "the stack's binary to install beside it (default: the source's name with -stack appended, when that file exists)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("install: unexpected argument %q", fs.Arg(0))
	}
	o := nodeinstall.Options{
		Source: *source, StackSource: *stackSource, BinDir: *binDir, ConfDir: *confDir, Name: name,
		Mode: nodeinstall.Mode(*mode), RecordPath: *record,
		Log: slog.New(slog.NewTextHandler(errOut, nil)),
	}
	var err error
	switch o.Mode {
	case nodeinstall.Standalone:
		if *conflist == "" || *plugin != "" {
			return errors.New("install: standalone mode takes --conflist FILE (and no --plugin)")
		}
		o.Conflist, err = os.ReadFile(*conflist)
	case nodeinstall.Chain:
		if *plugin == "" || *conflist != "" {
			return errors.New("install: chain mode takes --plugin FILE (and no --conflist)")
		}
		o.Plugin, err = os.ReadFile(*plugin)
	default:
		return fmt.Errorf("install: --mode %q: want %q or %q", *mode, nodeinstall.Standalone, nodeinstall.Chain)
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

	changed, err := nodeinstall.InstallBinary(o)
	if err != nil {
		return err
	}
	what := o.Name
	if o.StackSource != "" {
		what += " and " + nodeinstall.StackName(o.Name)
	}
	fmt.Fprintf(out, "binaries %s in %s: %s\n", what, o.BinDir, changeWord(changed))
	path, changed, err := nodeinstall.InstallConfig(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "configuration %s: %s\n", path, changeWord(changed))
	return nil
}

// RunUninstall is `cni-usernet uninstall`. The directories default
// to the ones recorded at install time; give them when this runs with
// another view of the same directories (on the host rather than in the
// agent's container).
func RunUninstall(args []string, errOut io.Writer) error {
	fs := flag.NewFlagSet("uninstall", flag.ContinueOnError)
	fs.SetOutput(errOut)
	binDir := fs.String("cni-bin-dir", "", "plugin directory of the runtime (default: as recorded)")
	confDir := fs.String("cni-conf-dir", "", "configuration directory of the runtime (default: as recorded)")
	record := fs.String("record", recordDefault, "the record install wrote")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("uninstall: unexpected argument %q", fs.Arg(0))
	}
	return nodeinstall.Uninstall(nodeinstall.Options{
		BinDir: *binDir, ConfDir: *confDir, Name: name, RecordPath: *record,
		Log: slog.New(slog.NewTextHandler(errOut, nil)),
	})
}

func changeWord(changed bool) string {
	if changed {
		return "installed"
	}
	return "unchanged"
}

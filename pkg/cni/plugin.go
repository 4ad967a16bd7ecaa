// Package cni implements the cni-usernet CNI verbs: it attaches a pod
// (veth + IPAM, or an interface an earlier plugin made), launches the pod's
// userspace stack, and undoes all of it on DEL and GC.
package cni

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/util/buildinfo"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// Main runs the plugin the way a runtime calls it: CNI_* environment
// variables and the configuration on stdin, the result on stdout.
func Main() {
	if data := intoNodeMountNS(); data != nil {
		stdinFrom(data)
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    recorded("ADD", cmdAdd),
		Del:    recorded("DEL", cmdDel),
		Check:  recorded("CHECK", cmdCheck),
		GC:     cmdGC,
		Status: cmdStatus,
	}, version.PluginSupports(netconf.CNIVersions...), buildinfo.String("cni-usernet")+": a userspace TCP/IP stack per pod")
}

// k8sArgs are the CNI_ARGS Kubernetes runtimes pass.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
}

// invocation is what every verb starts from.
type invocation struct {
	args  *skel.CmdArgs
	conf  *netconf.NetConf
	store state.Store
	log   *slog.Logger
	pod   k8sArgs
	close func()
	kube  *kube.Client // see kubeClient
	// steps times an ADD's steps for its log line; nil in the other verbs.
	steps *steptime.Steps
}

// step ends a timed step of ADD.
func (inv *invocation) step(name string) {
	if inv.steps != nil {
		inv.steps.Done(name)
	}
}

func start(args *skel.CmdArgs) (*invocation, error) {
	conf, err := netconf.Parse(args.StdinData)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	return startWith(args, conf), nil
}

// startForDelete is start for DEL: a configuration this version refuses
// (it may predate a rule) still deletes its pods, with what can be read.
func startForDelete(args *skel.CmdArgs) (*invocation, error) {
	conf, err := netconf.Parse(args.StdinData)
	if err == nil {
		return startWith(args, conf), nil
	}
	lenient, lerr := netconf.ParseForDelete(args.StdinData)
	if lerr != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	inv := startWith(args, lenient)
	inv.log.Warn("configuration refused; deleting with what can be read from it", "err", err)
	return inv, nil
}

func startWith(args *skel.CmdArgs, conf *netconf.NetConf) *invocation {
	inv := &invocation{args: args, conf: conf, store: state.Store{Dir: conf.StateDir}}
	_ = types.LoadArgs(args.Args, &inv.pod)
	inv.log, inv.close = openLog(conf.LogDir, slog.Group("cni",
		"cmd", os.Getenv("CNI_COMMAND"), "containerID", args.ContainerID, "netns", args.Netns,
		"ifName", args.IfName, "pod", string(inv.pod.K8S_POD_NAMESPACE)+"/"+string(inv.pod.K8S_POD_NAME)))
	if mountNSNote != "" {
		inv.log.Info("mount namespace", "mountNS", conf.MountNS, "reason", mountNSNote)
	}
	return inv
}

// openLog opens the per-node plugin log. Logs never go to stdout, which
// carries the CNI result; when the log cannot be opened they are dropped
// rather than failing the pod.
func openLog(dir string, attrs ...any) (*slog.Logger, func()) {
	if err := os.MkdirAll(dir, 0o700); err == nil {
		f, err := os.OpenFile(filepath.Join(dir, "plugin.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			return slog.New(slog.NewJSONHandler(f, nil)).With(attrs...), func() { f.Close() }
		}
	}
	return slog.New(slog.DiscardHandler), func() {}
}

func (inv *invocation) pathsFor(containerID, ifName string) attachment.Paths {
	return attachment.PathsFor(inv.conf.StateDir, inv.conf.RunDir, inv.conf.LogDir, containerID, ifName)
}

// teardown is the undo of containerID's ifName, from the network's
// configuration; the caller adds what the state or the verb knows.
func (inv *invocation) teardown(containerID, ifName, netns string) *attachment.Teardown {
	return &attachment.Teardown{
		Store: inv.store, Log: inv.log, RunDir: inv.conf.RunDir, LogDir: inv.conf.LogDir,
		TUNName: inv.conf.TUNName, ContainerID: containerID, IfName: ifName, Netns: netns, NetnsDir: inv.conf.NetnsDir,
		BPFDir: inv.conf.BPFDir,
	}
}

// lockTimeout bounds the wait for an attachment another verb or the node
// agent is working on (the agent holds it for at most one stack start).
const lockTimeout = 30 * time.Second

// cniError keeps a *types.Error as it is and wraps anything else with code.
func cniError(code uint, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return types.NewError(code, err.Error(), "")
}

func errorf(code uint, format string, a ...any) error {
	return types.NewError(code, fmt.Sprintf(format, a...), "")
}

package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/ethtool"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/shaping"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// undo collects the steps that reverse what ADD did so far; run on
// failure, in reverse order, dropped on success.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u undo) run() {
	for _, f := range slices.Backward(u) {
		f()
	}
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	steps := steptime.Start()
	inv, err := start(args)
	if err != nil {
		return err
	}
	defer inv.close()
	inv.steps = steps
	lock, err := inv.store.Lock(args.ContainerID, args.IfName, lockTimeout)
	if err != nil {
		return cniError(types.ErrTryAgainLater, err)
	}
	result, err := inv.add()
	// A failed ADD leaves no attachment, so nothing to keep a lock for.
	lock.Release()
	if err != nil {
		inv.log.Error("ADD failed", "err", err)
		return err
	}
	inv.log.Info("ADD done", "ips", result.IPs, steps.Attr("took"))
	return types.PrintResult(result, inv.conf.CNIVersion)
}

// addition is one ADD under way: what it decided before touching the
// node, what it has built so far, and the undo of that.
type addition struct {
	*invocation
	att   *state.Attachment
	paths attachment.Paths
	// netns is the pod's namespace, open until the undo has run: giving
	// an earlier plugin its interface back enters it.
	netns ns.NetNS
	// mode and modeSource are the GSO mode asked for and who asked.
	mode       offload.Mode
	modeSource string
	// cgroup is the stack's cgroup (launch.Options.CgroupPath).
	cgroup string
	undo   undo
}

// add attaches the pod. Every step arms the undo of what it made as it
// makes it; a failed ADD runs the undo, which leaves the node and the pod
// as they were.
func (inv *invocation) add() (_ *current.Result, err error) {
	a, err := inv.prepareAdd()
	if err != nil {
		return nil, err
	}
	if a.netns, err = openNetNS(inv.args.Netns); err != nil {
		return nil, err
	}
	defer a.netns.Close()
	defer func() {
		if err != nil {
			a.undo.run()
		}
	}()
	result, err := a.attachWire()
	if err != nil {
		return nil, err
	}
	if err := a.record(); err != nil {
		return nil, err
	}
	proc, err := a.startStack()
	if err != nil {
		return nil, err
	}
	if err := a.finish(result, proc); err != nil {
		return nil, err
	}
	return result, nil
}

// prepareAdd checks everything ADD can check before it touches the node:
// annotations, configuration, and that the attachment does not exist.
func (inv *invocation) prepareAdd() (*addition, error) {
	args, conf := inv.args, inv.conf
	if err := inv.loadAnnotations(); err != nil {
		return nil, err
	}
	a := &addition{invocation: inv}
	var err error
	if a.mode, a.modeSource, err = conf.GSOMode(); err != nil {
		inv.event(kube.EventWarning, "InvalidGSOAnnotation", err.Error()+"; the pod gets no network until the annotation is fixed")
		return nil, errorf(types.ErrInvalidNetworkConfig, "%v", err)
	}
	if _, _, err := conf.BusyPollWindow(); err != nil {
		inv.event(kube.EventWarning, "InvalidBusyPollAnnotation", err.Error()+"; the pod gets no network until the annotation is fixed")
		return nil, errorf(types.ErrInvalidNetworkConfig, "%v", err)
	}
	if _, _, err := conf.SocketRedirectMode(); err != nil {
		inv.event(kube.EventWarning, "InvalidSocketRedirectAnnotation", err.Error()+"; the pod gets no network until the annotation is fixed")
		return nil, errorf(types.ErrInvalidNetworkConfig, "%v", err)
	}
	if conf.NetworkPolicy && (inv.pod.K8S_POD_NAMESPACE == "" || inv.pod.K8S_POD_NAME == "") {
		return nil, errorf(types.ErrInvalidNetworkConfig, `"networkPolicy" is on, but CNI_ARGS names no pod (K8S_POD_NAMESPACE, K8S_POD_NAME): the node agent compiles a pod's policy from its API object`)
	}
	var cgroupNote string
	if a.cgroup, cgroupNote, err = inv.stackCgroup(); err != nil {
		return nil, err
	}
	if cgroupNote != "" {
		inv.event(kube.EventWarning, "StackChargedToNode", cgroupNote)
	}
	if bw := conf.RuntimeConfig.Bandwidth; bw != nil {
		if err := bw.Validate(); err != nil {
			return nil, errorf(types.ErrInvalidNetworkConfig, "runtimeConfig bandwidth: %v", err)
		}
	}
	if _, err := inv.store.Load(args.ContainerID, args.IfName); err == nil {
		return nil, errorf(types.ErrInternal, "container %s interface %s is already attached; DEL it before adding it again", args.ContainerID, args.IfName)
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, errUnreadableState(err, args.ContainerID, args.IfName)
	}
	a.att = &state.Attachment{
		Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		PodNS: string(inv.pod.K8S_POD_NAMESPACE), PodName: string(inv.pod.K8S_POD_NAME),
		Created: time.Now().UTC(), Chained: conf.Chained(),
	}
	a.paths = inv.pathsFor(args.ContainerID, args.IfName)
	return a, nil
}

// attachWire makes the stack's namespace and puts the pod's link to the
// node in it (the earlier plugin's chained; ours, leased and shaped,
// standalone), then fences the link's node end.
func (a *addition) attachWire() (*current.Result, error) {
	p, att := a.paths, a.att
	// A spec left by an earlier failed ADD describes a link that is gone;
	// the stack must collect afresh.
	if err := os.RemoveAll(p.StackDir); err != nil {
		return nil, errStateDir(a.conf.StateDir, fmt.Errorf("clearing %s: %w", p.StackDir, err))
	}
	a.undo.add(func() { os.RemoveAll(p.StackDir); os.Remove(p.Socket) })
	wirePath := attachment.WirePath(a.conf.NetnsDir, a.args.ContainerID, a.args.IfName)
	wire, err := a.makeWireNetns(wirePath, a.netns, &a.undo)
	if err != nil {
		return nil, err
	}
	defer wire.Close()
	att.WireNetns = wirePath
	var result *current.Result
	if att.Chained {
		if result, err = a.takeOverPrevious(a.netns); err != nil {
			return nil, err
		}
		if err := a.moveToWire(a.netns, wire, p.Spec, &a.undo); err != nil {
			return nil, err
		}
	} else {
		if result, err = a.attachVeth(a.netns, wire, att, &a.undo); err != nil {
			return nil, err
		}
		if err := a.shape(wire, att.HostVeth); err != nil {
			return nil, err
		}
	}
	for _, ipc := range result.IPs {
		att.IPs = append(att.IPs, ipc.Address.String())
	}
	if err := a.guardSources(wire, att, &a.undo); err != nil {
		return nil, err
	}
	a.step("wire")
	return result, nil
}

// record writes the stack's configuration and the attachment's record.
// The record is saved before the stack starts, so that a plugin killed
// mid-ADD leaves one DEL and GC can undo.
func (a *addition) record() error {
	p, att, conf := a.paths, a.att, a.conf
	if err := a.writeStackConfig(p, a.mode, att.WireNetns); err != nil {
		return errStateDir(conf.StateDir, fmt.Errorf("writing the stack's configuration: %w", err))
	}
	att.ConfigPath, att.SpecPath, att.ControlSocket, att.LogPath = p.Config, p.Spec, p.Socket, p.Log
	att.PolicyPath = p.Policy
	if err := a.store.Save(att); err != nil {
		return errStateDir(conf.StateDir, err)
	}
	a.undo.add(func() { a.store.Delete(att.ContainerID, att.IfName) })
	// A stack that fails after fencing the link and making its TUN leaves
	// them (it keeps them for a restart); undo them with the rest.
	td := a.teardown(att.ContainerID, att.IfName, att.Netns)
	td.Chained, td.IPs = att.Chained, att.IPs
	td.WireNetns = att.WireNetns
	a.undo.add(func() { td.CleanNetns() })
	a.step("state")
	return nil
}

// startStack starts the pod's stack and waits until it is ready.
func (a *addition) startStack() (launch.Process, error) {
	att, p := a.att, a.paths
	self, err := os.Executable()
	if err != nil {
		return launch.Process{}, cniError(types.ErrInternal, fmt.Errorf("finding own executable: %w", err))
	}
	stackBinary, err := attachment.StackBinary(self)
	if err != nil {
		return launch.Process{}, cniError(types.ErrInternal, err)
	}
	proc, err := launch.Start(launch.Options{
		Binary:       stackBinary,
		Args:         launch.StackArgs(p.Config),
		Netns:        att.Netns,
		WireNetns:    att.WireNetns,
		LogPath:      p.Log,
		ReadyTimeout: a.conf.ReadyTimeoutDuration(),
		CgroupPath:   a.cgroup,
		OOMScoreAdj:  launch.StackOOMScoreAdj,
	})
	if err != nil {
		return launch.Process{}, errorf(types.ErrInternal, "starting the pod's stack (gso %s from %s): %v", a.mode, a.modeSource, err)
	}
	a.undo.add(func() { launch.Stop(proc, attachment.StopGrace) })
	if proc.Warning != nil {
		a.log.Warn("stack started with a warning", "warning", proc.Warning)
	}
	att.StackPID, att.StackStartTime = proc.PID, proc.StartTime
	att.StackBinary = stackBinary
	if att.StackCgroups, err = launch.Cgroups(proc.PID); err != nil {
		return launch.Process{}, cniError(types.ErrInternal, err)
	}
	a.step("stack")
	return proc, nil
}

// finish reads the GSO mode the stack chose, has the node agent put the
// pod's policy in it when policy is on, and completes the record.
func (a *addition) finish(result *current.Result, proc launch.Process) error {
	att, conf := a.att, a.conf
	var st control.Status
	if err := control.FetchStatus(a.paths.Socket, 5*time.Second, &st); err != nil {
		return errorf(types.ErrInternal, "reading the stack's status: %v", err)
	}
	att.GSO = st.GSO
	a.step("status")
	if st.GSO.Mode == offload.ModeSoftware && att.HostVeth != "" {
		// The stack's packets reach the pod's link whole and its kernel's
		// GSO cuts them to the MTU there; with GRO on the node's end the
		// node takes each burst back as one aggregate (twice the
		// throughput pod→node, BENCHMARKS.md). Only speed depends on it.
		if on, err := ethtool.LinkGROOn(att.HostVeth); err != nil || !on {
			a.log.Warn("software GSO: GRO stays off on the node's end of the pod's link", "link", att.HostVeth, "on", on, "err", err)
		}
		a.step("gro")
	}
	a.redirect()
	if conf.NetworkPolicy {
		if err := a.requestPolicy(a.paths, att); err != nil {
			return err
		}
		a.step("policy")
	}
	var err error
	if att.Result, err = json.Marshal(result); err != nil {
		return cniError(types.ErrInternal, err)
	}
	if err := a.store.Save(att); err != nil {
		return errStateDir(conf.StateDir, err)
	}
	a.step("record")
	a.log.Info("stack started", "pid", proc.PID, "gso", st.GSO.Mode, "reason", st.GSO.Reason, "source", a.modeSource)
	a.event(kube.EventNormal, "GSOMode", fmt.Sprintf("GSO %s (requested %s by %s): %s; stack pid %d",
		st.GSO.Mode, a.mode, a.modeSource, st.GSO.Reason, proc.PID))
	return nil
}

// agentTimeout bounds the wait for the node agent to put the pod's policy
// in its stack: its caches are warm, so this is a compile and a push, or
// a watch delivering the pod a moment late.
const agentTimeout = 10 * time.Second

// requestPolicy asks the node agent to compile the pod's network policy and
// put it in the stack, and waits until the stack holds it: the pod's
// containers start isolated. The stack started closed (only the node gets
// in) until then. Any failure is "try again later" (code 11): the agent
// restarting, its caches not synced, the API server away; the caller's
// undo removes everything ADD did, and the runtime retries the sandbox.
func (inv *invocation) requestPolicy(p attachment.Paths, att *state.Attachment) error {
	sock := agentapi.Path(inv.conf.RunDir)
	gen, err := agentapi.RequestPolicy(context.Background(), sock, agentTimeout, agentapi.PolicyRequest{
		ContainerID: att.ContainerID, IfName: att.IfName,
		Namespace: att.PodNS, Pod: att.PodName, PodIPs: att.IPs,
		ControlSocket: p.Socket, PolicyPath: p.Policy,
	})
	if err != nil {
		return errorf(types.ErrTryAgainLater, "the pod's network policy is not in its stack (networkPolicy is on): %v", err)
	}
	inv.log.Info("network policy in the stack", "generation", gen)
	return nil
}

func (inv *invocation) writeStackConfig(p attachment.Paths, mode offload.Mode, wireNetns string) error {
	conf := inv.conf
	sc := conf.StackConfig(inv.args.IfName, mode, netconf.StackFiles{Spec: p.Spec, ControlSocket: p.Socket, Policy: p.Policy})
	sc.Version = stackconfig.Version
	sc.WireNetns = wireNetns
	if err := os.MkdirAll(p.StackDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", p.StackDir, err)
	}
	if err := os.MkdirAll(conf.RunDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", conf.RunDir, err)
	}
	b, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p.Config, b, 0o600)
}

// shape applies the pod's bandwidth annotations on both ends of its veth
// (pkg/node/shaping). Chained, the bandwidth plugin does it where the earlier
// plugin's veth is, before this plugin moves the pod's end: the installer
// puts it there, and declares the capability only on that entry.
func (inv *invocation) shape(wire ns.NetNS, hostVeth string) error {
	bw := inv.conf.RuntimeConfig.Bandwidth
	if bw == nil || bw.Zero() {
		return nil
	}
	if err := shaping.Apply(hostVeth, bw.IngressRate, bw.IngressBurst); err != nil {
		return cniError(types.ErrInternal, err)
	}
	err := wire.Do(func(ns.NetNS) error { return shaping.Apply(inv.args.IfName, bw.EgressRate, bw.EgressBurst) })
	if err != nil {
		return cniError(types.ErrInternal, err)
	}
	inv.log.Info("bandwidth shaped", "ingressRate", bw.IngressRate, "egressRate", bw.EgressRate)
	return nil
}

// takeOverPrevious finds the sandbox interface an earlier plugin reported
// and passes its result on.
func (inv *invocation) takeOverPrevious(netns ns.NetNS) (*current.Result, error) {
	prev, err := current.NewResultFromResult(inv.conf.PrevResult)
	if err != nil {
		return nil, errorf(types.ErrDecodingFailure, "converting prevResult: %v", err)
	}
	for _, iface := range prev.Interfaces {
		if iface.Name == inv.args.IfName && iface.Sandbox != "" {
			return prev, nil
		}
	}
	return nil, errorf(types.ErrInvalidNetworkConfig, "prevResult has no interface %q in a sandbox to take over", inv.args.IfName)
}

// attachVeth is the standalone path: lease addresses, create the veth with
// its pod end in the stack's namespace wire and configure both ends the
// way the standard ptp plugin does; the stack takes the pod end's
// configuration over from there. netns, the pod's, must not hold
// CNI_IFNAME: the stack's TUN takes that name.
func (inv *invocation) attachVeth(netns, wire ns.NetNS, att *state.Attachment, u *undo) (*current.Result, error) {
	conf, args := inv.conf, inv.args
	if conf.IPAM.Type == "" {
		return nil, errorf(types.ErrInvalidNetworkConfig, `no "ipam" section and no prevResult: cni-usernet needs one or the other`)
	}
	// Checked before the lease is taken; setupVeth would fail too, but
	// with a message that does not say what is there or what to do.
	if desc, err := linkInTheWay(netns, args.IfName); err != nil {
		return nil, cniError(types.ErrInternal, err)
	} else if desc != "" {
		return nil, errLinkInTheWay(args.IfName, args.Netns, desc)
	}
	inv.step("checks")
	r, err := ipam.ExecAdd(conf.IPAM.Type, args.StdinData)
	if err != nil {
		// Keep the IPAM plugin's own code, and say which plugin failed.
		var te *types.Error
		if errors.As(err, &te) {
			return nil, types.NewError(te.Code, fmt.Sprintf("IPAM %s: %s", conf.IPAM.Type, te.Msg), te.Details)
		}
		return nil, errorf(types.ErrInternal, "IPAM %s: %v", conf.IPAM.Type, err)
	}
	u.add(func() { ipam.ExecDel(conf.IPAM.Type, args.StdinData) })
	att.IPAMType, att.IPAMConf = conf.IPAM.Type, args.StdinData
	result, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, cniError(types.ErrDecodingFailure, fmt.Errorf("converting IPAM result: %w", err))
	}
	if len(result.IPs) == 0 {
		return nil, errorf(types.ErrInternal, "IPAM %s returned no address", conf.IPAM.Type)
	}
	inv.step("ipam")
	att.HostVeth = attachment.HostVethName(args.ContainerID, args.IfName)
	if err := setupVeth(wire, args.Netns, args.IfName, att.HostVeth, conf.MTU, result); err != nil {
		attachment.DelLink(att.HostVeth)
		return nil, cniError(types.ErrInternal, err)
	}
	u.add(func() { attachment.DelLink(att.HostVeth) })
	inv.step("veth")
	if conf.DNS.Nameservers != nil || conf.DNS.Domain != "" || len(conf.DNS.Search) > 0 {
		result.DNS = conf.DNS
	}
	return result, nil
}

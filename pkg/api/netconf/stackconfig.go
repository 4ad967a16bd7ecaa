package netconf

import (
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
)

// StackFiles are where a stack keeps its files (attachment.Paths has
// them).
type StackFiles struct {
	// Spec is the spec's file, ControlSocket the control socket's path,
	// Policy the policy file the node agent writes.
	Spec, ControlSocket, Policy string
}

// StackConfig is the pod stack's configuration for interface ifName in
// GSO mode mode (the conflist's default or the pod's annotation, already
// resolved), with its files at files: the one place a conflist setting
// becomes a stack setting. Defaults are the stack's own
// (stackconfig.Config.Validate).
func (c *NetConf) StackConfig(ifName string, mode offload.Mode, files StackFiles) stackconfig.Config {
	always, governed, busyPollOff := c.busyPollKeys()
	return stackconfig.Config{
		IfName:             ifName,
		GSO:                mode,
		SpecPath:           files.Spec,
		ControlSocket:      files.ControlSocket,
		Policy:             c.NetworkPolicy,
		PolicyPath:         files.Policy,
		TUNName:            c.TUNName,
		TUNMTU:             c.TUNMTU,
		GSOMaxSize:         c.GSOMaxSize,
		GSOMaxSegs:         c.GSOMaxSegs,
		GRO:                c.GROEnabled(),
		VerifyRXChecksums:  c.RXChecksumOffload != nil && !*c.RXChecksumOffload,
		WireQueueLen:       c.WireQueueLen,
		Threads:            c.StackThreads,
		BusyPoll:           stackconfig.Duration(always),
		BusyPollGoverned:   stackconfig.Duration(governed),
		BusyPollOff:        busyPollOff,
		MaxTCP:             c.MaxTCP,
		MaxUDP:             c.MaxUDP,
		UDPIdle:            stackconfig.Duration(c.UDPIdleDuration()),
		PodLinkOffloadsOff: c.PodLinkOffloadsOff,
	}
}

// busyPollKeys is BusyPollWindow as the stack configuration's keys: the
// conflist's window, polled always; the annotation's, which the stack's
// governor switches (a key of its own, which a stack of an earlier
// release ignores: it governs its default window instead of polling
// always); off. Both windows zero and not off: the governor's default.
// ADD calls StackConfig only after BusyPollWindow accepted the
// annotation: an annotation it would refuse leaves busy polling off.
func (c *NetConf) busyPollKeys() (always, governed time.Duration, off bool) {
	d, isGoverned, err := c.BusyPollWindow()
	switch {
	case err != nil:
		return 0, 0, true
	case isGoverned:
		return 0, d, false
	}
	return d, 0, d == 0
}

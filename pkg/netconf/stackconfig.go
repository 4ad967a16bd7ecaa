package netconf

import (
	"github.com/cni-usernet/cni-usernet/pkg/offload"
	"github.com/cni-usernet/cni-usernet/pkg/stackconfig"
)

// StackConfig is the pod stack's configuration for interface ifName in
// GSO mode mode (the conflist's default or the pod's annotation, already
// resolved), keeping its spec at specPath and serving its control socket
// at controlSocket: the one place a conflist setting becomes a stack
// setting. Defaults are the stack's own (stackconfig.Config.Validate).
func (c *NetConf) StackConfig(ifName string, mode offload.Mode, specPath, controlSocket string) stackconfig.Config {
	return stackconfig.Config{
		IfName:             ifName,
		GSO:                mode,
		SpecPath:           specPath,
		ControlSocket:      controlSocket,
		TUNName:            c.TUNName,
		TUNMTU:             c.TUNMTU,
		GSOMaxSize:         c.GSOMaxSize,
		GSOMaxSegs:         c.GSOMaxSegs,
		GRO:                c.GROEnabled(),
		VerifyRXChecksums:  c.RXChecksumOffload != nil && !*c.RXChecksumOffload,
		WireQueueLen:       c.WireQueueLen,
		Threads:            c.StackThreads,
		MaxTCP:             c.MaxTCP,
		MaxUDP:             c.MaxUDP,
		UDPIdle:            stackconfig.Duration(c.UDPIdleDuration()),
		PodLinkOffloadsOff: c.PodLinkOffloadsOff,
	}
}

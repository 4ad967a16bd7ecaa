package podstack

import (
	"fmt"
	"net/netip"
)

// Healthy reports whether the wire leg can carry the pod's traffic: its
// readers still receive from the link, its NIC is enabled, and it holds
// every address of the spec. A stack that only answered on its control
// socket could look healthy while passing nothing; these are the parts
// of it that a process alone does not prove.
func (s *Stack) Healthy() error {
	if err := s.failure.Load(); err != nil {
		return fmt.Errorf("the stack is deaf, a reader stopped: %w", *err)
	}
	if !s.WireUp() {
		return fmt.Errorf("wire NIC %s is not enabled", s.opts.Spec.IfName)
	}
	have := map[netip.Addr]bool{}
	for _, a := range s.Wire.AllAddresses()[wireNIC] {
		if ip, ok := netip.AddrFromSlice(a.AddressWithPrefix.Address.AsSlice()); ok {
			have[ip] = true
		}
	}
	for _, p := range s.opts.Spec.Addrs {
		if !have[p.Addr()] {
			return fmt.Errorf("wire NIC %s lacks the spec's address %s", s.opts.Spec.IfName, p)
		}
	}
	return nil
}

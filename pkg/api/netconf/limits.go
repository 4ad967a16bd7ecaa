package netconf

import (
	"fmt"
	"math"
)

// Limits are the runtime's bandwidth argument: rates in bits per second,
// bursts in bits. Zero rate: that direction is not shaped.
type Limits struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// Zero reports whether nothing is to be shaped.
func (l Limits) Zero() bool { return l.IngressRate == 0 && l.EgressRate == 0 }

// Validate refuses what the bandwidth plugin refuses, with its reasons: a
// rate without a burst, and a burst the kernel's 32-bit byte counters
// cannot hold.
func (l Limits) Validate() error {
	for _, d := range []struct {
		name        string
		rate, burst uint64
	}{{"ingress", l.IngressRate, l.IngressBurst}, {"egress", l.EgressRate, l.EgressBurst}} {
		if d.rate == 0 {
			continue
		}
		if d.burst == 0 {
			return fmt.Errorf("%sRate %d bit/s needs a %sBurst", d.name, d.rate, d.name)
		}
		if d.rate < 8 {
			return fmt.Errorf("%sRate %d bit/s is below one byte per second", d.name, d.rate)
		}
		if d.burst/8 >= math.MaxUint32 {
			return fmt.Errorf("%sBurst %d bits is too large: at most %d", d.name, d.burst, uint64(math.MaxUint32-1)*8)
		}
	}
	return nil
}

package nettest

import "fmt"

// SteadyRate is the mean of per-second rates (bits/s) once a token
// bucket's initial burst is spent: Kubernetes runtimes pass the bandwidth
// plugin a burst of 2^32-1 bits with every bandwidth annotation
// (containerd's CRI plugin; there is no burst annotation), which the first
// seconds of a transfer carry at whatever speed the path has. The first
// second at or under 125 % of target marks the bucket empty; the mean
// starts with the second after it and needs at least five. burst is the
// seconds before that one.
func SteadyRate(rates []float64, target float64) (mean float64, burst []float64, err error) {
	for i, r := range rates {
		if r > 1.25*target {
			continue
		}
		steady := rates[min(i+1, len(rates)):]
		if len(steady) < 5 {
			return 0, rates[:i], fmt.Errorf("only %d seconds after the burst: %.0f", len(steady), rates)
		}
		sum := 0.0
		for _, s := range steady {
			sum += s
		}
		return sum / float64(len(steady)), rates[:i], nil
	}
	return 0, rates, fmt.Errorf("never at the target: %.0f", rates)
}

//go:build tools

// Package peers pins the tools the benchmark builds to measure cni-usernet's
// peers: gVisor's runsc, at exactly the gVisor version the plugin's own
// go.mod uses (hack/bench/run.sh checks that they agree). It is a module of
// its own so that runsc's dependencies stay out of the plugin's module graph.
package peers

import _ "gvisor.dev/gvisor/runsc"

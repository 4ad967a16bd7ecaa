// Command coredns is the lab's cluster DNS: CoreDNS (coremain, from its Go
// module) with only the plugins the lab's Corefile uses, so that the build
// does not compile every cloud provider's SDK. The Corefile is in
// hack/k8s/coredns.yaml. The plugins run in CoreDNS's own order
// (dnsserver.Directives); those not imported here are unknown to it.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
)

func main() { coremain.Run() }

// Command coredns is CoreDNS with only the plugins test/cluster's cluster DNS needs, built
// from CoreDNS's Go module (hack/build-apiserver.sh coredns) because no registry is
// reachable to pull its image. Its Corefile is test/cluster's.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the plugins in the order CoreDNS chains them (its plugin.cfg order).
var directives = []string{
	"errors",
	"log",
	"health",
	"ready",
	"loadbalance",
	"cache",
	"kubernetes",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}

// Command shardproxy-bench-compare is `make bench-compare`: the same Services in a real
// kube-apiserver, served once by upstream kube-proxy (nftables mode) and once by one
// shardproxy instance, compared side by side from their metrics. See package compare;
// it needs root.
package main

import (
	"os"

	"github.com/shardproxy/shardproxy/test/bench/compare"
)

func main() { os.Exit(compare.Main(os.Args[1:])) }

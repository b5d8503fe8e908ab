// Command shardproxy is a Kubernetes service proxy that runs several proxy instances
// side by side on one node, each with its own nftables tables.
package main

import (
	"os"
)

func main() { os.Exit(run(os.Args, os.Stdout, os.Stderr)) }

// Command shardproxy-bench is `make bench`: it measures one shardproxy instance with the
// real nft in fresh network namespaces and prints a table and a JSON report. See
// package bench; it needs root.
package main

import (
	"os"

	"github.com/shardproxy/shardproxy/test/bench"
)

func main() { os.Exit(bench.Main(os.Args[1:])) }

// Command cluster-teardown tears down every cluster-layer node whose test process is
// gone: hack/test.sh runs it after the cluster layer, which go test's -timeout or the
// layer's ceiling can kill before its own teardown runs. It does nothing when the layer
// cleaned up after itself, and exits 1 if a teardown failed.
package main

import (
	"log"
	"os"

	"github.com/shardproxy/shardproxy/test/cluster"
)

func main() {
	if err := cluster.RemoveStale(log.Printf); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

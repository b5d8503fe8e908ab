// Command shardproxy is a Kubernetes service proxy that runs several proxy instances
// side by side on one node, each with its own nftables tables. The command line lives in
// package app; main only passes it the version and commit the linker stamped.
package main

import (
	"os"

	"github.com/shardproxy/shardproxy/cmd/shardproxy/app"
)

// version and commit are set at build time: -ldflags "-X main.version=v0.1.0 -X
// main.commit=<git commit>" (`make release`, hack/release.sh).
var (
	version = "dev"
	commit  = ""
)

func main() {
	os.Exit(app.Run(os.Args, os.Stdout, os.Stderr, app.Build{Version: version, Commit: commit}))
}
